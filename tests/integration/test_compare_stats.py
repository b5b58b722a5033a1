"""`ablate compare`'s statistics on hand-written run dirs (every number known): launches kept apart
unless --pool, 95% t intervals per arm, seed-paired differences with a verdict and a power line, the
not-enough-seeds message (one line for many), the self-contained report.html and curves against tokens
seen."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from integration.test_compare import write_run

from ablate.analysis import compare, stats

# rewards/margins per (loss, seed): hinge - sigmoid per seed = 0.3, 0.5, 0.4 (mean 0.4, all > 0)
MARGINS = {
    ("sigmoid", 1): 0.2,
    ("sigmoid", 2): 0.4,
    ("sigmoid", 3): 0.3,
    ("hinge", 1): 0.5,
    ("hinge", 2): 0.9,
    ("hinge", 3): 0.7,
}


def write_launch(root: Path, stamp: str, margins: dict = MARGINS, shift: float = 0.0) -> Path:
    sweep = root / "dpo_loss" / stamp
    for num, ((loss, seed), margin) in enumerate(margins.items()):
        run = write_run(
            sweep,
            num,
            ["sweep_name=dpo_loss", "method=dpo", f"method.args.loss_type={loss}", f"seed={seed}"],
            {"rewards/margins": margin + shift, "loss": 1.0 - margin},
        )
        (run / ".hydra" / "config.yaml").write_text(
            f"seed: {seed}\nmethod:\n  name: dpo\n  args:\n    loss_type: {loss}\n    beta: 0.1\n"
        )
        with (run / "metrics.jsonl").open("a") as f:  # tokens seen, for --x tokens
            f.write(
                json.dumps({"step": 5, "time": 3.0, "rewards/margins": margin, "num_input_tokens_seen": 500})
                + "\n"
            )
        s = json.loads((run / "summary.json").read_text())
        s.update(git_sha="abc123", versions={"torch": "2.13.0", "transformers": "5.24.0"})
        (run / "summary.json").write_text(json.dumps(s))
    (sweep / "multirun.yaml").write_text("{}\n")
    return sweep


def test_t_interval_hand_values() -> None:
    """stats.t_interval's docstring: [0.3, 0.5, 0.4]: mean 0.4, sd 0.1, t_{0.975, 2} = 4.302653,
    half-width 4.302653 · 0.1 / √3 = 0.248414."""
    assert stats.t_interval([0.3, 0.5, 0.4]) == pytest.approx((0.151586, 0.648414), abs=1e-6)
    assert stats.t_interval([0.5, 0.5, 0.5]) == (0.5, 0.5)
    assert stats.t_interval([0.1, 0.2]) is None  # too few for an interval


def test_paired_difference_and_verdicts() -> None:
    d = stats.paired(
        "sigmoid", {"1": [0.2], "2": [0.4], "3": [0.3]}, "hinge", {"1": [0.5], "2": [0.9], "3": [0.7]}, "m"
    )
    assert d.diffs == pytest.approx([0.3, 0.5, 0.4]) and d.mean == pytest.approx(0.4)
    assert d.ci == pytest.approx((0.151586, 0.648414), abs=1e-6)  # the t interval of [0.3, 0.5, 0.4]
    assert (
        d.verdict()
        == "hinge − sigmoid m = +0.4 [+0.1516, +0.6484], n=3 pairs: hinge higher (95% t interval excludes 0)"
    )
    assert d.clear and d.power_line() == ""  # clear already: no plan needed
    mixed = stats.paired(
        "a", {"1": [0.0], "2": [0.0], "3": [0.0]}, "b", {"1": [1.0], "2": [-1.0], "3": [0.5]}, "m"
    )
    assert mixed.verdict().endswith("no clear difference (95% t interval includes 0)")
    # mean 1/6, sd 1.0408: effect 0.160, which the t test finds at 80% power from 309 pairs on
    # the spread from 3 pairs (2 df): at the ends of its 80% chi-square interval, 135 and 2908 pairs
    assert mixed.power_line() == (
        "about 309 seeds per arm would make a difference of this size clear at 80% power (rough: the spread "
        "comes from 3 pairs; over its 80% interval 135-2908 seeds, and a small sweep tends to overstate the "
        "difference)"
    )
    same = stats.paired(
        "a", {"1": [1.0], "2": [1.0], "3": [1.0]}, "b", {"1": [1.0], "2": [1.0], "3": [1.0]}, "m"
    )
    assert same.verdict().endswith("n=3 pairs: identical in every pair") and same.power_line() == ""
    two = stats.paired("a", {"1": [0.0], "2": [0.0]}, "b", {"1": [1.0], "2": [2.0], "3": [9.0]}, "m")
    assert (
        two.n == 2
        and not two.clear
        and two.verdict().endswith(
            "n=2 pairs: not enough seeds to tell (a t interval needs 3 pairs); about 5 seeds per arm would make a "
            "difference of this size clear at 80% power (rough: the spread comes from 2 pairs; over its 80% "
            "interval 3-113 seeds, and a small sweep tends to overstate the difference)"
        )
    )  # mean 1.5, sd 0.707: effect 2.12
    one = stats.paired("a", {"1": [0.0]}, "b", {"1": [1.0]}, "m")
    assert one.verdict().endswith(
        "n=1 pair: not enough seeds to tell (a t interval needs 3 pairs); run at least 3 seeds per arm"
    )
    assert "no seed ran in both arms" in stats.paired("a", {"1": [0.0]}, "b", {"2": [1.0]}, "m").verdict()
    assert d.pvalue == pytest.approx(0.020204, abs=1e-6)  # t = 0.4 / (0.1 / √3) = 6.9282, 2 df
    # t = (1/6) / (1.0408 / √3) = 0.2774, 2 df
    assert mixed.pvalue == pytest.approx(0.8075, abs=1e-4) and two.pvalue is None


def test_an_interval_is_cut_at_a_bound_the_metric_cannot_pass(tmp_path: Path) -> None:
    """grad_norm over 3 seeds [0.05, 0.1, 1.2]: mean 0.45, sd 0.65, t interval 0.45 ± 4.3027 · 0.65 / √3 =
    [-1.165, 2.065] crosses 0, which a norm cannot pass: the table shows [0*, 2.065] and says why; a
    margin's interval ([-0.2, 0.1, 0.4]: 0.1 ± 0.7452) may cross 0."""
    assert stats.bounded((-0.3387, 1.296), "grad_norm") == ((0.0, 1.296), True)
    assert stats.bounded((0.8, 1.1), "eval_rewards/accuracies") == ((0.8, 1.0), True)
    assert stats.bounded((-0.3, 0.5), "rewards/margins") == ((-0.3, 0.5), False)
    sweep = tmp_path / "s" / "2026-01-01_00-00-00"
    for num, (norm, margin) in enumerate([(0.05, -0.2), (0.1, 0.1), (1.2, 0.4)]):
        write_run(sweep, num, [f"seed={num}"], {"grad_norm": norm, "rewards/margins": margin})
    (sweep / "multirun.yaml").write_text("{}\n")
    out = subprocess.run(
        [sys.executable, "-m", "ablate", "compare", str(sweep), "--metric", "grad_norm,rewards/margins"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    ).stdout
    assert "0.45 [0, 2.065]*" in out and "0.1 [-0.6452, 0.8452]" in out and "0.8452]*" not in out
    assert "*: the t interval crossed a bound the metric cannot pass (below 0; above 1 for a rate)" in out


def test_two_launches_are_kept_apart_unless_pooled(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    first = write_launch(tmp_path, "2026-01-01_10-00-00")
    second = write_launch(tmp_path, "2026-01-01_11-00-00", shift=0.1)
    rows = compare.compare([first, second], metrics=["rewards/margins"])  # both launches named
    out = capsys.readouterr().out
    assert [r["runs"] for r in rows] == [3, 3, 3, 3]  # n=3 per arm per launch, not 6
    assert rows[0]["group"] == "[dpo_loss/2026-01-01_10-00-00] loss_type=sigmoid"
    assert "2 launches kept apart" in out and "--pool" in out
    assert out.count("hinge − ") == 2  # one paired difference per launch

    pooled = compare.compare([tmp_path / "dpo_loss"], metrics=["rewards/margins"], pool=True)
    out = capsys.readouterr().out
    assert [r["group"] for r in pooled] == ["loss_type=sigmoid", "loss_type=hinge"]
    assert [r["runs"] for r in pooled] == [6, 6] and "pooled 2 launches (--pool)" in out
    assert pooled[0]["rewards/margins mean"] == pytest.approx(0.35)  # (0.9 + 1.2) / 6
    # pooled pairing: a seed both launches ran counts once (its mean), so still n=3 pairs
    assert "n=3 pairs" in out


def test_cli_prints_intervals_and_verdict_and_writes_a_self_contained_report(tmp_path: Path) -> None:
    sweep = write_launch(tmp_path, "2026-01-01_10-00-00")
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "ablate", "compare", str(sweep), "--out", str(out), "--x", "step,tokens"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "0.3 [0.05159, 0.5484]" in proc.stdout  # sigmoid rewards/margins, mean [95% t interval]
    assert (
        "loss_type=hinge − loss_type=sigmoid rewards/margins = +0.4 [+0.1516, +0.6484], n=3 pairs: "
        "loss_type=hinge higher (95% t interval excludes 0)"
    ) in proc.stdout, proc.stdout
    assert "95% t interval over the per-seed differences (assumes they are roughly normal" in proc.stdout
    assert (out / "rewards_margins_vs_tokens.png").is_file() and (
        out / "rewards_margins_vs_step.png"
    ).is_file()

    page = (out / "report.html").read_text()
    assert "<script" not in page and "http" not in page.replace("http-equiv", "")  # opens with no server
    images = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert len(images) == len(list(out.glob("*.png"))) and base64.b64decode(images[0])[:4] == b"\x89PNG"
    assert "n=3 pairs: loss_type=hinge higher" in page
    assert "method.args.loss_type=hinge seed=2" in page  # each run's overrides
    assert "abc123" in page and "transformers 5.24.0" in page  # git sha, versions
    keys = page.split("Config keys that differ between arms")[1].split("<h2>")[0]
    assert "method.args.loss_type" in keys and "method.args.beta" not in keys and ">seed<" not in keys


def test_too_few_seeds_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    two = {k: v for k, v in MARGINS.items() if k[1] < 3}
    rows = compare.compare([write_launch(tmp_path, "2026-01-01_10-00-00", two)], metrics=["rewards/margins"])
    out = capsys.readouterr().out
    assert rows[0]["rewards/margins ci_low"] is None and "0.3 ± 0.14" in out
    assert "n=2 pairs: not enough seeds to tell (a t interval needs 3 pairs); about" in out
