"""The measurements that decide, per device type, which speed paths run by default (ablate.speed.plan).

A path runs on a device only when a recorded run there showed it exact (the plain path's numbers, to
float rounding) and not slower. The records are `measured.json` next to this file, one per device type:

    {"cuda": {"run": "benchmarks/gpu.py, NVIDIA H200, torch 2.11.0+cu130, 2026-12-05, commit abc123",
              "paths": {"padding_free": {"on": true, "exact": true, "max_abs_diff": 3e-6, "speedup": 1.12,
                                         "basis": "DPO bf16 ~0.5B: 0.281 vs 0.315 s/step (speed=off)"}, ...}}}

`benchmarks/gpu.py --record` writes a device's entry from its own run (`verdict` is the rule); a device
with no entry runs no path by default (`speed.unverified_devices=true` asks for them anyway).

CPUs differ more than one record can say (a path measured faster on a 2-core AMD EPYC of one generation
need not be on the next, with AVX-512, nor on an Intel Xeon with AMX, whose oneDNN kernels TRL's layout
profits from), so the CPU's entry holds one record per CPU family (`"cpu": {"families": [{"family":
{...}, "run": ..., "paths": ...}]}`), written by benchmarks/dpo_vs_trl.py and grpo_vs_trl.py `--record`.
A family is what decides which kernels run (`cpu_family()`): architecture, vendor, the CPU family number
(AMD's Zen 3 is 25, Zen 5 26), the kernel level torch dispatches to, the AVX-512 extensions and AMX. A CPU
uses the most specific record whose recorded fields all match it, and only a record that names at least
the kernel fields (`KEY`): a record of vendor alone would hand one generation's decisions to another. A
CPU with no record runs the plain path (no path on by default, the table says why; measure it with
`--record`). The file is package data: the speed plan reads it, names the record in its table and
records each path's basis in run.json.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

PACKAGED = Path(__file__).with_name("measured.json")
# ABLATE_SPEED_RECORD: a record of your own (e.g. your cluster's CPUs, written by the benchmarks' --record to
# a copy) instead of the package's; the test suite points it at tests/speed_record.json (every path on)
RECORD = Path(os.environ.get("ABLATE_SPEED_RECORD") or PACKAGED)
# float32 differences up to which a path counts as exact (the CPU tests' tolerance), and the speedup
# (plain step time / the path's) at or above which it counts as not slower
EXACT_ATOL = 1e-4
NOT_SLOWER = 1.0
# the fields a CPU record must name to decide for a CPU: those that choose the kernels
KEY = ("arch", "vendor", "capability", "amx")
# the AVX-512 extensions torch's and oneDNN's kernels take (bf16 and VNNI dot products)
AVX512 = ("avx512f", "avx512_bf16", "avx512_vnni")


@dataclass(frozen=True)
class Measured:
    """One path's record on one device: whether it runs by default, and why."""

    on: bool
    why: str  # the basis, and the run that measured it


def verdict(exact: bool, speedup: float | None) -> bool:
    """The rule: exact, and measured not slower than the plain path."""
    return bool(exact) and speedup is not None and speedup >= NOT_SLOWER


@cache
def _load(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def records(path: Path | None = None) -> dict[str, Any]:
    return _load(str(path or RECORD))


@cache
def cpu_family() -> dict[str, Any]:
    """This CPU's family as the records key it: architecture, vendor (or ARM implementer), the CPU family
    number (x86's `cpu family`; None elsewhere), the kernel level torch dispatches to (get_cpu_capability:
    DEFAULT under ATEN_CPU_CAPABILITY=default), the AVX-512 extensions it has (of `AVX512`) and AMX tiles."""
    import torch

    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() not in info:
                info[key.strip()] = value.strip()
    except OSError:  # not Linux: the architecture and the kernel level still tell families apart
        pass
    flags = set((info.get("flags") or info.get("Features") or "").split())
    vendor = info.get("vendor_id") or (
        info.get("CPU implementer") and f"implementer {info['CPU implementer']}"
    )
    number = info.get("cpu family")
    return {
        "arch": platform.machine(),
        "vendor": vendor or "unknown",
        "family": int(number) if number and number.isdigit() else None,
        "amx": "amx_tile" in flags,
        "avx512": [f for f in AVX512 if f in flags],
        "capability": torch.backends.cpu.get_cpu_capability(),
    }


def describe(family: dict[str, Any]) -> str:
    """'x86_64 AuthenticAMD family 26 AVX512 (avx512f, avx512_bf16)'; fields left out are not shown."""
    words = [str(family[k]) for k in ("arch", "vendor") if family.get(k) is not None]
    if family.get("family") is not None:
        words.append(f"family {family['family']}")
    if family.get("capability") is not None:
        words.append(str(family["capability"]))
    if family.get("avx512"):
        words.append(f"({', '.join(family['avx512'])})")
    return " ".join(words) + (" AMX" if family.get("amx") else "")


def entry(device: str, path: Path | None = None, family: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record that decides on `device` ({} when none): for the CPU, its family's (module docstring)."""
    got = records(path).get(device)
    if not isinstance(got, dict) or "families" not in got:
        return got if isinstance(got, dict) else {}
    here = family or cpu_family()
    rows = [r for r in got["families"] if isinstance(r, dict) and isinstance(r.get("family"), dict)]
    fits = [r for r in rows if decides(r["family"], here)]
    if fits:
        return max(fits, key=lambda r: len(r["family"]))
    recorded = "; ".join(describe(r["family"]) for r in rows) or "none"
    return {
        "run": f"no record for this CPU family ({describe(here)}; recorded: {recorded}): the plain path",
        "paths": {},
    }


def decides(recorded: dict[str, Any], here: dict[str, Any]) -> bool:
    """Whether a record of family `recorded` decides for a CPU of family `here`: it names the kernel fields
    (`KEY`) and every field it names is this CPU's (an empty family: a record for any CPU, the suite's)."""
    if recorded and not all(k in recorded for k in KEY):
        return False
    return all(here.get(k) == v for k, v in recorded.items())


def measured(device: str, path: Path | None = None) -> dict[str, Measured]:
    """Each recorded path on `device` (a device type: cpu, cuda, ...): {} when no run there is recorded."""
    entry_ = entry(device, path)
    if not entry_:
        return {}
    return _decisions(device, entry_)


def _decisions(device: str, entry: dict[str, Any]) -> dict[str, Measured]:
    run = str(entry.get("run", "an unnamed run"))
    out = {}
    for name, rec in (entry.get("paths") or {}).items():
        if not isinstance(rec, dict):
            continue
        on = bool(rec.get("on"))
        speed = rec.get("speedup")
        if on:
            why = f"{rec.get('basis') or 'measured'} ({run})"
        elif not rec.get("exact", False):
            why = f"not exact on {device}: max |diff| {rec.get('max_abs_diff')} vs the plain path ({run})"
        else:
            shown = f"{speed:.2f}x" if isinstance(speed, (int, float)) else "no speed measured"
            why = f"slower than the plain path on {device}: {shown} ({rec.get('basis') or run})"
        out[name] = Measured(on, why)
    return out


def write(
    device: str,
    run: str,
    paths: dict[str, dict[str, Any]],
    path: Path | None = None,
    family: dict[str, Any] | None = None,
) -> Path:
    """Record `device`'s run (`paths`: name -> exact, max_abs_diff, speedup, basis; `on` set by `verdict`),
    keeping the other devices' entries; on the CPU, this CPU family's record (`family`: cpu_family()),
    keeping the other families'."""
    path = path or RECORD
    data = dict(records(path))
    new = {
        "run": run,
        "paths": {
            name: {**rec, "on": verdict(rec.get("exact", False), rec.get("speedup"))}
            for name, rec in sorted(paths.items())
        },
    }
    if device == "cpu":
        family = family or cpu_family()
        rows = [r for r in (data.get("cpu") or {}).get("families", []) if r.get("family") != family]
        new = {"families": [*rows, {"family": family, **new}]}
    data[device] = new
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    _load.cache_clear()
    return path
