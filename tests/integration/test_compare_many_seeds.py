"""`ablate compare` with many seeds and per-example eval scores, on hand-written run dirs (every
number known): the IQM column, probability of improvement with its Mann-Whitney p-value, performance
profiles in report.html, paired per-example differences (Miller 2024), the summary in words; and below
5 seeds, none of these."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from integration.test_compare import write_run

from ablate.analysis import compare

# rewards/margins per seed 1..6. IQM (N=6, k=1): sigmoid mean(0.2, 0.3, 0.4, 0.5) = 0.35, hinge
# mean(0.6, 0.7, 0.8, 0.9) = 0.75. P(hinge > sigmoid): of the 36 pairs hinge 0.5 beats 4 and ties 1
# (4.5), 0.6 beats 5 and ties 1 (5.5), 0.7..1.0 beat all 6 (24): 34 / 36 = 0.944; with ties, the
# Mann-Whitney p-value is the share of the 924 splits of the 12 values at least as extreme: 0.011.
# loss = 1 - margin (lower is better): the same pairs, so P(hinge better) = 0.944 too; IQM 0.65 and 0.25.
MARGINS = {"sigmoid": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], "hinge": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]}
# rewards/accuracies: the same six values in both arms, in another seed order: P = 0.5, not clear
ACCURACIES = {"sigmoid": [0.5, 0.6, 0.7, 0.5, 0.6, 0.7], "hinge": [0.6, 0.5, 0.7, 0.6, 0.7, 0.5]}
# per-example eval scores (eval_examples.jsonl). sigmoid's q0 is 0.1 on odd seeds and 0.3 on even
# ones: its mean over the arm's runs is 0.2, so the arms' means are [0.2, 0.4, 0.6, 0.8] and
# [0.3, 0.6, 0.6, 1.0]: d = [0.1, 0.2, 0, 0.2], mean 0.125, SE sqrt(0.0275 / 3) / 2 = 0.047871,
# t interval 0.125 ± 3.182 · 0.047871 = [-0.02735, 0.2773] (not clear with 4 examples), unpaired SE
# 0.193 (per_example.paired_examples' docstring). q9, which only hinge scored, is not paired.
EXAMPLES = {
    "sigmoid": lambda seed: {"q0": 0.1 if seed % 2 else 0.3, "q1": 0.4, "q2": 0.6, "q3": 0.8},
    "hinge": lambda seed: {"q0": 0.3, "q1": 0.6, "q2": 0.6, "q3": 1.0, "q9": 5.0},
}


def write_sweep(
    root: Path,
    seeds: int = 6,
    examples: bool = True,
    stamp: str = "2026-01-01_00-00-00",
    hinge_seeds: int | None = None,
) -> Path:
    sweep = root / "dpo_loss" / stamp
    num = 0
    for loss, n in (("sigmoid", seeds), ("hinge", hinge_seeds or seeds)):
        for seed in range(1, n + 1):
            margin, accuracy = MARGINS[loss][seed - 1], ACCURACIES[loss][seed - 1]
            run = write_run(
                sweep,
                num,
                ["sweep_name=dpo_loss", "method=dpo", f"method/dpo_loss={loss}", f"seed={seed}"],
                {"rewards/margins": margin, "rewards/accuracies": accuracy, "loss": 1.0 - margin},
            )
            if examples:
                rows = [
                    {"id": i, "index": n, "rewards/margins": v}
                    for n, (i, v) in enumerate(EXAMPLES[loss](seed).items())
                ]
                (run / "eval_examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            num += 1
    (sweep / "multirun.yaml").write_text("{}\n")
    return sweep


def test_six_seeds_add_iqm_probability_of_improvement_and_words(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    rows = {r["group"]: r for r in compare.compare([write_sweep(tmp_path, examples=False)])}
    out = capsys.readouterr().out
    assert rows["dpo_loss=sigmoid"]["rewards/margins iqm"] == pytest.approx(0.35)
    assert rows["dpo_loss=hinge"]["rewards/margins iqm"] == pytest.approx(0.75)
    assert rows["dpo_loss=sigmoid"]["loss iqm"] == pytest.approx(0.65) and rows["dpo_loss=hinge"][
        "loss iqm"
    ] == pytest.approx(0.25)
    assert re.search(r"│\s+0\.35 │", out) and re.search(
        r"│\s+0\.75 │", out
    )  # the IQM column: a value, no interval
    assert "rewards/margins IQM" in out and "IQM: interquartile mean over seeds" in out

    assert (
        "P(dpo_loss=hinge better than dpo_loss=sigmoid on rewards/margins) = 0.94, 6 vs 6 seeds, Mann-Whitney "
        "p = 0.011: clear, dpo_loss=hinge better (p < 0.05)"
    ) in out
    assert (
        "P(dpo_loss=hinge better than dpo_loss=sigmoid on loss) = 0.94, 6 vs 6 seeds, Mann-Whitney p = 0.011"
        in out
    )
    assert "on rewards/accuracies) = 0.50, 6 vs 6 seeds, Mann-Whitney p = 1: not clear (p ≥ 0.05)" in out

    words = out.split("in words")[1].splitlines()[1:]
    # one line per metric: the t test and the Mann-Whitney test, Holm over the two, BH over the 3 metrics
    assert (
        "  clear: dpo_loss=hinge higher than dpo_loss=sigmoid on rewards/margins (seed-paired t p < 0.001; "
        "adjusted for 2 tests, 3 metrics: < 0.001)"
    ) in words
    assert (
        "  clear: dpo_loss=hinge lower than dpo_loss=sigmoid on loss (seed-paired t p < 0.001; adjusted for 2 "
        "tests, 3 metrics: < 0.001)"
    ) in words
    assert (
        "  not clear: dpo_loss=hinge vs dpo_loss=sigmoid on rewards/accuracies (seed-paired t p = 1; adjusted "
        "for 2 tests, 3 metrics: = 1)"
    ) in words
    assert len([w for w in words if w.startswith("  ")]) == 3
    assert "per-example" not in out  # no eval_examples.jsonl


def test_per_example_differences_pair_the_shared_examples(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Miller 2024's paired SE on hand-written eval_examples.jsonl (numbers: EXAMPLES above); 4 seeds
    are enough: the examples, not the seeds, are the sample."""
    compare.compare([write_sweep(tmp_path, seeds=4)], metrics=["rewards/margins"])
    out = capsys.readouterr().out
    assert (
        "dpo_loss=hinge − dpo_loss=sigmoid eval rewards/margins = +0.125 [-0.02735, +0.2773] (SE 0.048 paired, "
        "0.19 unpaired), n=4 examples: not clear (95% interval includes 0)"
    ) in out
    # the per-example test of the held-out margins (p = 0.08: t = 0.125 / 0.04787 = 2.611, 3 df), with the
    # training margins' seed-paired test the 2 metrics of this pair
    assert (
        "  not clear: dpo_loss=hinge vs dpo_loss=sigmoid on eval_rewards/margins (per example p = 0.08; "
        "adjusted for 1 test, 2 metrics: = 0.08)"
    ) in out
    assert "IQM" not in out and "probability of improvement (" not in out  # 4 seeds: no many-seed statistics


def test_report_shows_the_many_seed_sections_and_profiles(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "report"
    # the CLI, as a user runs it; also proves compare stays light (no torch, no transformers)
    code = (
        "import sys; from ablate.cli import main; main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "compare", str(write_sweep(tmp_path)), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "250"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "clear, dpo_loss=hinge better" in proc.stdout and "n=4 examples: not clear" in proc.stdout
    for metric in ("rewards_margins", "rewards_accuracies", "loss"):
        assert (out / f"{metric}_profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text()
    for section in (
        "<h2>Probability of improvement</h2>",
        "<h2>Performance profiles</h2>",
        "<h2>Per-example paired differences (eval)</h2>",
        "<h2>In words</h2>",
    ):
        assert section in page
    assert "alt='loss_profile'" in page and len(re.findall(r"src='data:image/png", page)) == len(
        list(out.glob("*.png"))
    )
    assert "clear: dpo_loss=hinge lower than dpo_loss=sigmoid on loss (seed-paired t p &lt; 0.001" in page
    assert "not clear: dpo_loss=hinge vs dpo_loss=sigmoid on rewards/accuracies (seed-paired t p = 1" in page
    assert (out / "summary.md").read_text().splitlines()[0] == (
        "| group | runs | status | rewards/accuracies | rewards/accuracies IQM | rewards/margins | rewards/margins IQM "
        "| loss | loss IQM | runtime (s) | steps |"
    )
    table = {r["group"]: r for r in csv.DictReader((out / "summary.csv").open())}
    assert float(table["dpo_loss=hinge"]["rewards/margins iqm"]) == pytest.approx(0.75)


OLD_HEADER = "| group | runs | status | rewards/accuracies | rewards/margins | loss | runtime (s) | steps |"
OLD_KEYS = {"group", "runs", "status", "runtime_s mean", "runtime_s std", "steps"} | {
    f"{m} {k}"
    for m in ("rewards/accuracies", "rewards/margins", "loss")
    for k in ("mean", "std", "n", "cut", "ci_low", "ci_high")
}


def test_below_five_seeds_no_many_seed_statistics(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """4 seeds per arm; one arm of 6 next to one of 4; two launches of 3 seeds pooled (6 runs, but 3
    seeds): none of them gets a many-seed statistic, and without eval_examples.jsonl the words rest on the
    seed-paired test alone."""
    four = write_sweep(tmp_path / "four", seeds=4, examples=False)
    report = tmp_path / "report"
    rows = compare.compare([four], out=report if _has_matplotlib() else None)
    out = capsys.readouterr().out
    assert all(set(r) == OLD_KEYS for r in rows)
    for new in ("IQM", "probability of improvement", "P(", "per-example", "Mann-Whitney p"):
        assert new not in out, new
    assert "clear: dpo_loss=hinge higher than dpo_loss=sigmoid on rewards/margins (seed-paired t p" in out
    assert "n=4 pairs: dpo_loss=hinge higher (95% t interval excludes 0)" in out  # the seed-paired verdicts
    if _has_matplotlib():
        assert (report / "summary.md").read_text().splitlines()[0] == OLD_HEADER
        assert not list(report.glob("*_profile.png"))
        page = (report / "report.html").read_text()
        assert "Probability of improvement" not in page

    uneven = compare.compare([write_sweep(tmp_path / "uneven", seeds=6, hinge_seeds=4, examples=False)])
    assert [r["runs"] for r in uneven] == [6, 4] and all(set(r) == OLD_KEYS for r in uneven)
    assert "IQM" not in capsys.readouterr().out

    for stamp in ("2026-01-01_10-00-00", "2026-01-01_11-00-00"):
        write_sweep(tmp_path / "pooled", seeds=3, examples=False, stamp=stamp)
    pooled = compare.compare([tmp_path / "pooled"], pool=True)
    assert [r["runs"] for r in pooled] == [6, 6] and all(set(r) == OLD_KEYS for r in pooled)
    assert "IQM" not in capsys.readouterr().out  # a seed both launches ran counts once


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
