"""`ablate compare`'s statistics on hand-written run dirs (every number known): launches kept apart
unless --pool, 95% bootstrap intervals per arm, seed-paired differences with a verdict, the
too-few-seeds message, the self-contained report.html and curves against tokens seen."""

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
MARGINS = {("sigmoid", 1): 0.2, ("sigmoid", 2): 0.4, ("sigmoid", 3): 0.3,
           ("hinge", 1): 0.5, ("hinge", 2): 0.9, ("hinge", 3): 0.7}


def write_launch(root: Path, stamp: str, margins: dict = MARGINS, shift: float = 0.0) -> Path:
    sweep = root / "dpo_loss" / stamp
    for num, ((loss, seed), margin) in enumerate(margins.items()):
        run = write_run(sweep, num, ["sweep_name=dpo_loss", "method=dpo", f"method.args.loss_type={loss}", f"seed={seed}"],
                        {"rewards/margins": margin + shift, "loss": 1.0 - margin})
        (run / ".hydra" / "config.yaml").write_text(
            f"seed: {seed}\nmethod:\n  name: dpo\n  args:\n    loss_type: {loss}\n    beta: 0.1\n")
        with (run / "metrics.jsonl").open("a") as f:  # tokens seen, for --x tokens
            f.write(json.dumps({"step": 5, "time": 3.0, "rewards/margins": margin, "num_input_tokens_seen": 500}) + "\n")
        s = json.loads((run / "summary.json").read_text())
        s.update(git_sha="abc123", versions={"torch": "2.13.0", "transformers": "5.24.0"})
        (run / "summary.json").write_text(json.dumps(s))
    (sweep / "multirun.yaml").write_text("{}\n")
    return sweep


def test_bootstrap_interval_brackets_the_mean_and_is_reproducible() -> None:
    values = [0.1, 0.2, 0.3, 0.4]
    lo, hi = stats.bootstrap_ci(values)
    assert 0.1 <= lo < 0.25 < hi <= 0.4  # inside the values' range, around the mean
    assert stats.bootstrap_ci(values) == (lo, hi)  # fixed RNG seed
    assert stats.bootstrap_ci([0.5, 0.5, 0.5]) == (0.5, 0.5)
    assert stats.bootstrap_ci([0.1, 0.2]) is None  # too few for an interval


def test_paired_difference_and_verdicts() -> None:
    d = stats.paired("sigmoid", {"1": [0.2], "2": [0.4], "3": [0.3]}, "hinge", {"1": [0.5], "2": [0.9], "3": [0.7]}, "m")
    assert d.diffs == pytest.approx([0.3, 0.5, 0.4]) and d.mean == pytest.approx(0.4)
    lo, hi = d.ci
    assert 0.3 <= lo <= 0.4 <= hi <= 0.5
    assert d.verdict() == f"hinge − sigmoid m = +0.4 [{lo:+.4g}, {hi:+.4g}], n=3 pairs: hinge higher (95% interval excludes 0)"
    mixed = stats.paired("a", {"1": [0.0], "2": [0.0], "3": [0.0]}, "b", {"1": [1.0], "2": [-1.0], "3": [0.5]}, "m")
    assert mixed.verdict().endswith("no clear difference (95% interval includes 0)")
    same = stats.paired("a", {"1": [1.0], "2": [1.0], "3": [1.0]}, "b", {"1": [1.0], "2": [1.0], "3": [1.0]}, "m")
    assert same.verdict().endswith("n=3 pairs: identical in every pair")
    two = stats.paired("a", {"1": [0.0], "2": [0.0]}, "b", {"1": [1.0], "2": [2.0], "3": [9.0]}, "m")
    assert two.n == 2 and "n=2 pairs: too few seeds to say anything" in two.verdict()
    assert "no seed ran in both arms" in stats.paired("a", {"1": [0.0]}, "b", {"2": [1.0]}, "m").verdict()


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
    proc = subprocess.run([sys.executable, "-m", "ablate", "compare", str(sweep), "--out", str(out), "--x", "step,tokens"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    lo, hi = stats.bootstrap_ci([0.2, 0.4, 0.3])
    assert f"0.3 [{lo:.4g}, {hi:.4g}]" in proc.stdout  # sigmoid rewards/margins, mean [95% CI]
    assert re.search(r"loss_type=hinge − loss_type=sigmoid rewards/margins = \+0\.4 \[\+0\.3\d*, \+0\.[45]\d*\], "
                     r"n=3 pairs: loss_type=hinge higher", proc.stdout), proc.stdout
    assert (out / "rewards_margins_vs_tokens.png").is_file() and (out / "rewards_margins_vs_step.png").is_file()

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
    assert "n=2 pairs: too few seeds to say anything" in out
