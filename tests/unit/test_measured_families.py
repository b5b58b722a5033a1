"""The CPU's speed decisions are keyed by CPU family (ablate.speed.measured): a CPU uses its family's record,
an unmeasured family runs a path only where every recorded family measured it exact and not slower."""

from __future__ import annotations

import json

import pytest

from ablate.speed import measured
from ablate.speed.plan import DPO, SpeedSwitches, Setting, resolve

AMD = {"arch": "x86_64", "vendor": "AuthenticAMD"}
INTEL = {"arch": "x86_64", "vendor": "GenuineIntel", "capability": "AVX512", "amx": True}


def _rec(on: bool, speedup: float | None = 1.2, exact: bool = True) -> dict:
    return {"on": on, "exact": exact, "speedup": speedup, "basis": f"{speedup}x"}


@pytest.fixture
def record(tmp_path):
    path = tmp_path / "measured.json"
    path.write_text(
        json.dumps(
            {
                "cpu": {
                    "families": [
                        {
                            "family": AMD,
                            "run": "amd run",
                            "paths": {"padding_free": _rec(True), "lean_layers": _rec(True)},
                        },
                        {
                            "family": INTEL,
                            "run": "intel run",
                            "paths": {"padding_free": _rec(False, 0.9), "lean_layers": _rec(True)},
                        },
                    ]
                }
            }
        )
    )
    return path


def test_a_cpu_uses_its_own_familys_record(record):
    amd = measured.entry("cpu", record, family={**AMD, "capability": "AVX2", "amx": False})
    assert amd["run"] == "amd run"  # the AMD record leaves capability out: it holds for every AMD CPU
    intel = measured.entry("cpu", record, family=INTEL)
    assert intel["run"] == "intel run" and intel["paths"]["padding_free"]["on"] is False
    # the same Intel CPU under ATEN_CPU_CAPABILITY=default is another family (other kernels): unmeasured
    assert measured.entry("cpu", record, family={**INTEL, "capability": "DEFAULT"})["run"].startswith(
        "no record for this CPU (x86_64 GenuineIntel DEFAULT AMX)"
    )


def test_an_unmeasured_family_runs_only_what_every_family_measured_faster(record):
    arm = measured.entry(
        "cpu",
        record,
        family={"arch": "aarch64", "vendor": "implementer 0x41", "capability": "DEFAULT", "amx": False},
    )
    assert "amd run" in arm["run"] and "intel run" in arm["run"]
    assert arm["paths"]["lean_layers"]["on"] and not arm["paths"]["padding_free"]["on"]
    assert arm["paths"]["padding_free"]["speedup"] == 0.9  # the worst recorded


def test_the_plan_follows_this_cpus_record(record, monkeypatch):
    monkeypatch.setattr(measured, "RECORD", record)
    monkeypatch.setattr(measured, "cpu_family", lambda: INTEL)
    plan = resolve(
        "policy", Setting(model_type="llama", attention="sdpa", device="cpu"), SpeedSwitches(), DPO
    )
    off = {d.name: d.why for d in plan.decisions if not d.on}
    assert plan.on("lean_layers") and off["padding_free"].startswith(
        "slower than the plain path on cpu: 0.90x"
    )
    assert "no recorded run" in off["dpo_pair_rows"]  # measured on no family: off, as on any device
    assert plan.table().splitlines()[-1] == "  decided on cpu by: intel run"


def test_write_keeps_the_other_families(record):
    measured.write(
        "cpu",
        "new amd run",
        {"padding_free": {"exact": True, "speedup": 0.5, "basis": "b"}},
        path=record,
        family=AMD,
    )
    rows = json.loads(record.read_text())["cpu"]["families"]
    assert [r["run"] for r in rows] == ["intel run", "new amd run"]
    assert rows[1]["paths"] == {"padding_free": {"exact": True, "speedup": 0.5, "basis": "b", "on": False}}


def test_this_machine_has_a_family():
    family = measured.cpu_family()
    assert family["arch"] and family["vendor"] and family["capability"] and isinstance(family["amx"], bool)


def test_the_packages_record_has_the_measured_families():
    """The shipped record: the AMD EPYC's (every path on) and the Intel Xeon AVX-512/AMX one's, whose DPO
    measurement found the pair rows, padding-free rows and lean layers slower than the plain path there."""
    rows = json.loads(measured.PACKAGED.read_text())["cpu"]["families"]
    assert [r["family"].get("vendor") for r in rows] == ["AuthenticAMD", "GenuineIntel"]
    intel = measured.entry("cpu", measured.PACKAGED, family=INTEL)
    assert "Intel" in intel["run"] and {n for n, r in intel["paths"].items() if not r["on"]} == {
        "dpo_pair_rows",
        "padding_free",
        "lean_layers",
    }
    assert all(r["exact"] for r in intel["paths"].values())
    # an unmeasured family (ARM, or ATEN_CPU_CAPABILITY=default here): what both families ran
    other = measured.entry("cpu", measured.PACKAGED, family={**INTEL, "capability": "DEFAULT"})
    assert {n for n, r in other["paths"].items() if r["on"]} == {
        "completion_only_logits",
        "grpo_group_rows",
        "length_groups",
        "shared_prefill",
    }


def test_the_suite_runs_on_its_own_record():
    assert measured.RECORD.name == "speed_record.json" and measured.RECORD != measured.PACKAGED
