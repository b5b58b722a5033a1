"""The CPU's speed decisions are keyed by CPU family (ablate.speed.measured: what chooses the kernels, the
vendor's family number, torch's kernel level, AVX-512 extensions, AMX): a CPU uses its family's record, and
a family with none runs the plain path."""

from __future__ import annotations

import json

import pytest

from ablate.speed import measured
from ablate.speed.plan import DPO, SpeedSwitches, Setting, resolve

ZEN3 = {
    "arch": "x86_64",
    "vendor": "AuthenticAMD",
    "family": 25,
    "capability": "AVX2",
    "avx512": [],
    "amx": False,
}
ZEN5 = {**ZEN3, "family": 26, "capability": "AVX512", "avx512": ["avx512f", "avx512_bf16", "avx512_vnni"]}
ZEN4 = {**ZEN5, "family": 25}  # AMD's family 25 with AVX-512 (Zen 4): Zen 3's number, other kernels
INTEL = {"arch": "x86_64", "vendor": "GenuineIntel", "capability": "AVX512", "amx": True}
AMD = {"arch": "x86_64", "vendor": "AuthenticAMD"}  # a record keyed by vendor alone (the old form)


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
                            "family": ZEN3,
                            "run": "zen3 run",
                            "paths": {"padding_free": _rec(True), "lean_layers": _rec(True)},
                        },
                        {
                            "family": INTEL,
                            "run": "intel run",
                            "paths": {"padding_free": _rec(False, 0.9), "lean_layers": _rec(True)},
                        },
                        {"family": AMD, "run": "vendor-only run", "paths": {"padding_free": _rec(True)}},
                    ]
                }
            }
        )
    )
    return path


def test_a_cpu_uses_its_own_familys_record(record):
    assert measured.entry("cpu", record, family=ZEN3)["run"] == "zen3 run"
    intel = measured.entry("cpu", record, family={**INTEL, "family": 6, "avx512": ["avx512f"]})
    assert intel["run"] == "intel run" and intel["paths"]["padding_free"]["on"] is False  # fields it names


def test_another_generation_of_a_vendor_does_not_inherit_its_record(record):
    """A Zen 5 (AVX-512) is not a Zen 3: no record decides for it (the vendor-only one names no kernel
    fields), so it runs the plain path until it is measured."""
    zen5 = measured.entry("cpu", record, family=ZEN5)
    assert zen5["paths"] == {}
    assert zen5["run"].startswith(
        "no record for this CPU family (x86_64 AuthenticAMD family 26 AVX512 "
        "(avx512f, avx512_bf16, avx512_vnni); recorded: "
    )
    assert zen5["run"].endswith("the plain path")
    # the same Intel CPU under ATEN_CPU_CAPABILITY=default dispatches other kernels: unmeasured too
    assert measured.entry("cpu", record, family={**INTEL, "capability": "DEFAULT"})["paths"] == {}


def test_a_record_that_names_no_kernel_fields_decides_for_no_cpu():
    assert not measured.decides(AMD, ZEN3)
    assert measured.decides(ZEN3, ZEN3) and not measured.decides(ZEN3, ZEN5)
    assert measured.decides({}, ZEN5)  # an empty family: a record for any CPU (the test suite's)


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


def test_an_unmeasured_cpu_runs_the_plain_path(record, monkeypatch):
    monkeypatch.setattr(measured, "RECORD", record)
    monkeypatch.setattr(measured, "cpu_family", lambda: ZEN5)
    plan = resolve(
        "policy", Setting(model_type="llama", attention="sdpa", device="cpu"), SpeedSwitches(), DPO
    )
    assert not any(d.on for d in plan.decisions if d.name not in ("liger", "compile"))
    assert all("benchmarks/dpo_vs_trl.py, grpo_vs_trl.py --record" in d.why for d in plan.decisions)
    assert "no record for this CPU family (x86_64 AuthenticAMD family 26" in plan.table().splitlines()[-1]


def test_write_keeps_the_other_families(record):
    measured.write(
        "cpu",
        "new zen3 run",
        {"padding_free": {"exact": True, "speedup": 0.5, "basis": "b"}},
        path=record,
        family=ZEN3,
    )
    rows = json.loads(record.read_text())["cpu"]["families"]
    assert [r["run"] for r in rows] == ["intel run", "vendor-only run", "new zen3 run"]
    assert rows[2]["paths"] == {"padding_free": {"exact": True, "speedup": 0.5, "basis": "b", "on": False}}


def test_this_machine_has_a_family():
    family = measured.cpu_family()
    assert family["arch"] and family["vendor"] and family["capability"] and isinstance(family["amx"], bool)
    assert isinstance(family["avx512"], list) and set(family["avx512"]) <= set(measured.AVX512)


def test_the_packages_record_has_the_measured_families():
    """The shipped record: the AMD EPYC's (Zen 3, AVX2; Zen 4, AVX-512) and the Intel Xeon AVX-512/AMX one's,
    whose DPO measurement found the pair rows, padding-free rows and lean layers slower than the plain path
    there."""
    rows = json.loads(measured.PACKAGED.read_text())["cpu"]["families"]
    assert sorted(r["family"].get("vendor") for r in rows) == ["AuthenticAMD", "AuthenticAMD", "GenuineIntel"]
    assert all(
        measured.decides(r["family"], r["family"]) and set(measured.KEY) <= set(r["family"]) for r in rows
    )
    intel = measured.entry("cpu", measured.PACKAGED, family=INTEL)
    assert "Intel" in intel["run"] and {n for n, r in intel["paths"].items() if not r["on"]} == {
        "dpo_pair_rows",
        "padding_free",
        "lean_layers",
    }
    assert all(r["exact"] for r in intel["paths"].values())
    zen3 = measured.entry("cpu", measured.PACKAGED, family=ZEN3)
    assert "AMD EPYC" in zen3["run"] and set(zen3["paths"]) == set(intel["paths"])
    # Zen 4 shares Zen 3's family number, not its record: its own (pair rows and padding-free rows off)
    zen4 = measured.entry("cpu", measured.PACKAGED, family=ZEN4)
    assert zen4 != zen3 and {n for n, r in zen4["paths"].items() if not r["on"]} == {
        "dpo_pair_rows",
        "padding_free",
    }
    assert set(zen4["paths"]) == set(intel["paths"]) and all(r["exact"] for r in zen4["paths"].values())
    # an unmeasured family (a Zen 5 with AVX-512, or ATEN_CPU_CAPABILITY=default here): the plain path
    assert measured.entry("cpu", measured.PACKAGED, family=ZEN5)["paths"] == {}


def test_the_suite_runs_on_its_own_record():
    assert measured.RECORD.name == "speed_record.json" and measured.RECORD != measured.PACKAGED
