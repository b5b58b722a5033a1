"""Reference curves (torchtune / TRL-invariant style): each method's short tiny-model run must reproduce
the per-step values recorded in tests/reference/curves.json, each step within what CPU kernels were
measured to move it (tests/reference/README.md). A change beyond that is a change in the numbers a
researcher gets; the failure says whether the code, the library versions or the CPU kernels differ from
the recording. Rerecord only on purpose (`python tests/reference/record.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reference.record import COMMON, KEYS, KERNEL_VARS, MARGIN, RUNS, curve, machine, tolerance, versions

CURVES = json.loads((Path(__file__).resolve().parents[1] / "reference" / "curves.json").read_text())


def test_recorded_runs_are_the_current_ones():
    """The recording covers every method the recorder knows, with the same overrides and metrics, each
    step with its measured spread."""
    assert CURVES["common"] == COMMON
    assert {m: r["overrides"] for m, r in CURVES["runs"].items()} == RUNS
    assert {m: list(r["metrics"]) for m, r in CURVES["runs"].items()} == KEYS
    for run in CURVES["runs"].values():
        assert all(len(c["spread"]) == len(c["values"]) for c in run["metrics"].values())
    assert set(CURVES["recorded_on"]) == {"cpu", "arch", "cpu_capability", "threads", "kernel_env"}


def what_differs(recorded: dict, measured_on: list[dict], now: dict, now_versions: dict) -> str:
    """Which of (library versions, CPU kernels) differ from the recording; neither: the code changed."""
    said = []
    if CURVES["versions"] != now_versions:
        changed = {
            k: f"{v} -> {now_versions.get(k)}"
            for k, v in CURVES["versions"].items()
            if now_versions.get(k) != v
        }
        said.append(
            f"Library versions differ ({changed}): install with -c constraints.txt, or rerecord "
            "if the upgrade is on purpose"
        )
    kernels = {k: f"{v} -> {now.get(k)}" for k, v in recorded.items() if now.get(k) != v}
    if kernels:
        known = any(
            all(m.get(k) == now.get(k) for k in ("cpu", "arch", "cpu_capability")) for m in measured_on
        )
        said.append(
            f"CPU kernels differ ({kernels}); "
            + (
                "the spread was measured on this CPU too, so the kernels alone should not explain it: suspect the code"
                if known
                else "the spread was not measured on this CPU: if no code changed, measure it here with "
                "python tests/reference/record.py --add-cpu (tests/reference/README.md)"
            )
        )
    if not said:
        said.append(
            "The library versions and CPU kernels are the recording's: a code change moved the numbers; "
            "if it is intended, rerecord: python tests/reference/record.py"
        )
    return "; ".join(said)


def outside(method: str, got: dict[str, list[float]]) -> list[tuple[str, int, float, float, float]]:
    """(metric, step, got, recorded, allowed) for each step of `got` outside the recorded tolerance."""
    off = []
    for key, rec in CURVES["runs"][method]["metrics"].items():
        expected, allowed = rec["values"], tolerance(rec["values"], rec["spread"])
        assert len(got[key]) == len(expected), (method, key, got[key])
        off += [
            (key, i, g, e, t)
            for i, (g, e, t) in enumerate(zip(got[key], expected, allowed))
            if abs(g - e) > t
        ]
    return off


@pytest.mark.parametrize("method", sorted(RUNS))
def test_curve_matches_reference(method):
    if off := outside(method, curve(method)):
        key, i, g, e, t = max(off, key=lambda o: abs(o[2] - o[3]) / o[4])
        pytest.fail(
            f"{method}: {len(off)} steps outside the measured tolerance (worst: {key} at step {i}: {g!r} vs "
            f"{e!r} recorded, |diff| {abs(g - e):.2g} > {t:.2g} allowed). Recorded on {CURVES['recorded_on']} "
            f"with {CURVES['versions']}. "
            + what_differs(CURVES["recorded_on"], CURVES["spread_measured_on"], machine(), versions())
        )


# Small real changes, each of which the tolerance must catch: the noisiest method (reward: Adam's first steps
# amplify rounding) with a 1% larger lr, and DPO with beta 0.11 for 0.1.
@pytest.mark.parametrize(
    ("method", "change"), [("reward", "optimizer.optimizer.lr=0.00303"), ("dpo", "method.args.beta=0.11")]
)
def test_a_small_real_change_fails_the_comparison(method, change):
    assert len(outside(method, curve(method, change))) >= 5


def test_the_failure_names_what_differs():
    """Each cause in its words: the same machine and versions (the code), other versions, another CPU."""
    rec = {"cpu": "AMD EPYC 7B13", "arch": "x86_64", "cpu_capability": "AVX2", "threads": 1, "kernel_env": {}}
    same = what_differs(rec, [rec], dict(rec), dict(CURVES["versions"]))
    assert same.startswith("The library versions and CPU kernels are the recording's: a code change")
    other = {**CURVES["versions"], "torch": "9.9"}
    assert "Library versions differ ({'torch': " in what_differs(rec, [rec], dict(rec), other)
    intel = {**rec, "cpu": "Intel Xeon", "cpu_capability": "AVX512"}
    unmeasured = what_differs(rec, [rec], intel, dict(CURVES["versions"]))
    assert "CPU kernels differ" in unmeasured and "'cpu_capability': 'AVX2 -> AVX512'" in unmeasured
    assert "--add-cpu" in unmeasured and "a code change moved" not in unmeasured
    assert "suspect the code" in what_differs(rec, [rec, intel], intel, dict(CURVES["versions"]))
    forced = {**rec, "kernel_env": {"ATEN_CPU_CAPABILITY": "default"}}
    assert "kernel_env" in what_differs(rec, [rec], forced, dict(CURVES["versions"])) and KERNEL_VARS


def test_tolerance_is_the_measured_spread_with_a_margin():
    """Step 0 (every kernel gave the same loss): float32 rounding only; later steps: MARGIN x the spread."""
    dpo = CURVES["runs"]["dpo"]["metrics"]["loss"]
    allowed = tolerance(dpo["values"], dpo["spread"])
    assert dpo["spread"][0] == 0 and allowed[0] == pytest.approx(1e-6 * dpo["values"][0])
    assert all(t >= MARGIN * s for t, s in zip(allowed, dpo["spread"]))
    assert max(allowed) < 1e-4 * max(dpo["values"])  # a tolerance, not a free pass
