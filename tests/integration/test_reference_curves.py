"""Reference loss curves (torchtune / TRL-invariant style): each method's short tiny-model run must
reproduce the per-step values recorded in tests/reference/curves.json. A change here is a change in
the numbers a researcher gets; rerecord only on purpose (`python tests/reference/record.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reference.record import COMMON, KEYS, RUNS, curve, versions

CURVES = json.loads((Path(__file__).resolve().parents[1] / "reference" / "curves.json").read_text())


def test_recorded_runs_are_the_current_ones():
    """The recording covers every method the recorder knows, with the same overrides."""
    assert CURVES["common"] == COMMON
    assert {m: r["overrides"] for m, r in CURVES["runs"].items()} == RUNS
    assert {m: r["metric"] for m, r in CURVES["runs"].items()} == KEYS


@pytest.mark.parametrize("method", sorted(RUNS))
def test_curve_matches_reference(method):
    expected = CURVES["runs"][method]["values"]
    got = curve(method)
    assert len(got) == len(expected)
    # one thread: identical up to CPU-specific float rounding. The pinned versions
    # (constraints.txt) keep an upstream release from moving these numbers unnoticed.
    assert got == pytest.approx(expected, rel=1e-4, abs=1e-6), (
        f"{method} no longer reproduces its reference curve (recorded with {CURVES['versions']}, "
        f"running {versions()}); if the change is intended, rerecord: python tests/reference/record.py")
