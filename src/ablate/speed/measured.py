"""The measurements that decide, per device type, which speed paths run by default (ablate.speed.plan).

A path runs on a device only when a recorded run there showed it exact (the plain path's numbers, to
float rounding) and not slower. The records are `measured.json` next to this file, one per device type:

    {"cuda": {"run": "benchmarks/gpu.py, NVIDIA H200, torch 2.11.0+cu130, 2026-12-05, commit abc123",
              "paths": {"padding_free": {"on": true, "exact": true, "max_abs_diff": 3e-6, "speedup": 1.12,
                                         "basis": "DPO bf16 ~0.5B: 0.281 vs 0.315 s/step (perf=off)"}, ...}}}

`benchmarks/gpu.py --record` writes a device's entry from its own run (`verdict` is the rule); a device
with no entry runs no path by default (`perf.unverified_devices=true` asks for them anyway). The CPU's
entry records the measurements of benchmarks/dpo_vs_trl.py and grpo_vs_trl.py (docs/benchmarks.md) and
the exactness tests. The file is package data: the speed plan reads it, names it in its table and
records each path's basis in run.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

RECORD = Path(__file__).with_name("measured.json")
# float32 differences up to which a path counts as exact (the CPU tests' tolerance), and the speedup
# (plain step time / the path's) at or above which it counts as not slower
EXACT_ATOL = 1e-4
NOT_SLOWER = 1.0


@dataclass(frozen=True)
class Measured:
    """One path's record on one device: whether it runs by default, and why."""

    on: bool
    why: str  # the basis, and the run that measured it


def verdict(exact: bool, speedup: float | None) -> bool:
    """The rule: exact, and measured not slower than the plain path."""
    return bool(exact) and speedup is not None and speedup >= NOT_SLOWER


@lru_cache(maxsize=None)
def _load(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def records(path: Path | None = None) -> dict[str, Any]:
    return _load(str(path or RECORD))


def measured(device: str, path: Path | None = None) -> dict[str, Measured]:
    """Each recorded path on `device` (a device type: cpu, cuda, ...): {} when no run there is recorded."""
    entry = records(path).get(device)
    if not isinstance(entry, dict):
        return {}
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


def write(device: str, run: str, paths: dict[str, dict[str, Any]], path: Path | None = None) -> Path:
    """Record `device`'s run (`paths`: name -> exact, max_abs_diff, speedup, basis; `on` set by `verdict`),
    keeping the other devices' entries."""
    path = path or RECORD
    data = dict(records(path))
    data[device] = {"run": run, "paths": {name: {**rec, "on": verdict(rec.get("exact", False), rec.get("speedup"))}
                                          for name, rec in sorted(paths.items())}}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    _load.cache_clear()
    return path
