"""One GPU benchmark: ablate beside TRL 1.16 on one GPU, each speed path on and off, exactness on the device,
and the GPU smoke lines; its record decides which speed paths run by default on CUDA (ablate.speed.measured).

    python benchmarks/gpu.py                          # everything, <= 8 min on one H200 (--budget 470 s)
    python benchmarks/gpu.py --record                 # ... and write its verdicts into src/ablate/speed/measured.json
    python benchmarks/gpu.py --device cpu --tiny      # the same script on a CPU, tiny shapes (a test runs it)
    python benchmarks/gpu.py --sections exact,dpo     # some sections (exact, dpo, smoke, grpo, sft, dpo_large)

Sections, in this order, each within its share of --budget (SECONDS: a section runs its most decisive rows
first and names those past its time "not started"; one that would start past --budget is skipped, and says
so). Without a CUDA GPU the script says so in one line and exits 2 (--device cpu: the dry run).
- exact: float32, TF32 off, on the device: each speed path alone against speed=off (benchmarks/gpu_exact.py),
  and the measured bf16 matmul peak the MFU columns use.
- dpo: DPO, bf16 autocast, a ~0.5B Llama shape (hidden 1536 x 16 layers, 12 heads / 4 KV, vocab 49152;
  random init from config, built on the GPU), 8 pairs of ~800 tokens a side, precomputed reference, 10 steps.
  TRL in its fastest configuration (no gradient checkpointing), then ablate: every path forced, speed=off,
  the CUDA default, each path alone, forced + Liger, forced + compile; each its own process
  (benchmarks/gpu_sides.py), a fresh model from the same seed.
- smoke: the GPU smoke lines (`ablate train`, tiny model: fp16, bf16 + tf32, fp32 + tf32, SFT fp16, live
  8-/4-bit references, AdamW8bit, DPO, GRPO, GRPO spg 4, LoRA, QLoRA DPO/SFT/GRPO), 8 at a time.
- grpo: GRPO, bf16, the 0.5B shape, generation on the GPU (16 completions x 64 new tokens, 8 per prompt,
  temperature 1, beta 0, DAPO aggregation, 4 steps of one generation round each): TRL (model.generate) and
  ablate (speed=off: model.generate; forced; the default; each GRPO path alone). Each generation round
  samples from torch's RNG seeded alike on every side (grpo_vs_trl._seeded), so TRL and speed=off draw the
  same completions: their per-step reward and gradient norm agree, not only their (on-policy, ~0) loss.
- sft: SFT, the 0.5B shape, bf16, 8 prompt/completion rows of ~800 tokens, 8 steps, completion-only loss:
  TRL and ablate (speed=off, forced, the default, lean layers, Liger, compile).
- dpo_large: the dpo section at ~1.5B (hidden 2048 x 24 layers, 16 heads / 4 KV): TRL, forced, speed=off,
  default. Last: it runs on the time the others leave.

Tables (benchmarks/harness.py), one per timed section, TRL's row first: s/step (median after each run's
first step; GRPO's steps include their generation round), process s, tokens/s, MFU against the measured bf16
peak, GPU peak memory (torch.cuda.max_memory_allocated, per variant), and the per-step agreement with TRL's
row: the largest loss difference, for GRPO the largest reward difference, and the largest relative
difference of the gradient norm. `--out FILE`: every number as JSON.
`--record`: each path exact (the exact section) and not slower than speed=off (dpo for the DPO paths,
grpo for GRPO's) is recorded on, else off with its numbers. The GPU machine reaches no package index:
scripts/gpu_wheels.sh downloads the wheels here and prints the one install line (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness  # benchmarks/harness.py (the script's dir is on sys.path)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ALL = {"unverified_devices": True}  # every path, on a device no record has verified
DPO_PATHS = ("completion_only_logits", "padding_free", "dpo_pair_rows", "lean_layers")
GRPO_PATHS = ("shared_prefill", "grpo_group_rows", "length_groups")
# ablate's variants: name -> perf ("off", one path's name alone, or SpeedSwitches fields); "default": SpeedSwitches() as the
# device's record decides it; "forced": every path. In each section's order of what decides most: a section cut
# short by its time (SECONDS) keeps the first rows.
# DPO: TRL, then every path forced (the speed claim, never measured on a GPU yet: the H200's one try was cut at
# 76 s), then speed=off (TRL's layout; measured there: TRL's speed at 1.06x its memory). GRPO and SFT: TRL, then
# speed=off (TRL's layout: the same per-step losses, the table's agreement check), then forced.
DPO_VARIANTS = {
    "forced": ALL,
    "off": "off",
    "default": {},
    **{p: p for p in DPO_PATHS},
    "forced+liger": {"liger": True, **ALL},
    "forced+compile": {"compile": True, **ALL},
}
LARGE_VARIANTS = {k: DPO_VARIANTS[k] for k in ("forced", "off", "default")}
GRPO_VARIANTS = {"off": "off", "forced": ALL, "default": {}, **{p: p for p in GRPO_PATHS}}
SFT_VARIANTS = {
    "off": "off",
    "forced": ALL,
    "default": {},
    "lean_layers": "lean_layers",
    "liger": {"liger": True, **ALL},
    "compile": {"compile": True, **ALL},
}
# Each section's expected seconds on one H200, in the default run's order, summing to the default --budget (470 s:
# one ~8-minute device call with the wheels' install). A section gets the time left times its share of the sections
# still to run, so one that runs long leaves every later section its turn, and time a section leaves unused goes to
# the later ones. Sized by reasoning (no GPU in the session that wrote it) from the two H200 runs (2026-12-04): a
# process of TRL's 0.5B DPO 38-49 s, of ablate's speed=off 24 s (imports, CUDA, model, data; its 10 steps are
# ~3 s), the forced one > 76 s (FlexAttention compiles in each process), header + exact 108 s. So the default run
# expects: exact; dpo TRL + forced; smoke 15 tiny lines, 8 at a time; grpo TRL + off; sft TRL + off; dpo_large
# (1.5B) last, on what the others leave. The other rows (and the per-path rows --record's verdicts need) come
# from runs of fewer sections, each then getting more of the budget (docs/benchmarks.md).
SECONDS = {"exact": 130, "dpo": 160, "smoke": 35, "grpo": 70, "sft": 55, "dpo_large": 20}
QLORA = ["+peft=qlora", "model.quantization_config.bnb_4bit_compute_dtype=bfloat16", "precision=bf16"]
SMOKE = [  # name, `ablate train` overrides, runs on a CPU too (--tiny)
    ("fp16", ["precision=fp16"], False),
    ("bf16_tf32", ["precision=bf16", "precision.tf32=true"], False),
    ("fp32_tf32", ["precision=fp32", "precision.tf32=true"], False),
    ("sft_fp16", ["method=sft", "precision=fp16"], False),
    ("ref_8bit", ["+ref_model=live_8bit"], False),
    ("ref_4bit", ["+ref_model=live_4bit"], False),
    ("adamw_8bit", ["optimizer=adamw_8bit"], False),
    ("dpo", [], True),
    ("grpo", ["method=grpo"], True),
    ("grpo_spg4", ["method=grpo", "method.args.steps_per_generation=4", "precision=bf16"], False),
    ("lora_dpo", ["+peft=lora", "precision=bf16"], False),
    ("qlora_dpo", [*QLORA, "peft.save_merged=true"], False),
    ("qlora_live", [*QLORA, "method.args.precompute_ref_log_probs=false"], False),
    ("qlora_sft", ["method=sft", *QLORA], False),
    ("qlora_grpo", ["method=grpo", *QLORA, "method.args.beta=0.04"], False),
]


def configs(device: str, tiny: bool) -> dict[str, dict[str, Any]]:
    """Each section's child config: full shapes on a GPU, tiny ones (seconds on a CPU) with --tiny."""
    base = {
        "device": device,
        "bf16": device == "cuda",
        "exact_shape": "tiny" if tiny else "exact",
        "exact_side": 12 if tiny else 96,
        "exact_new_tokens": 8 if tiny else 32,
    }
    if tiny:  # without Liger (CUDA only) and torch.compile (minutes on a CPU): the paths' code, in seconds
        dpo = dict(shape="tiny", steps=3, batch=2, side_tokens=24)

        def quick(variants):
            return {k: v for k, v in variants.items() if "liger" not in k and "compile" not in k}

        return {
            "exact": base,
            "dpo": {**base, **dpo, "kind": "dpo", "variants": quick(DPO_VARIANTS)},
            "dpo_large": {**base, **dpo, "kind": "dpo", "variants": LARGE_VARIANTS},
            "grpo": {
                **base,
                "kind": "grpo",
                "shape": "tiny",
                "steps": 2,
                "batch": 4,
                "generations": 2,
                "new_tokens": 8,
                "prompt_tokens": 8,
                "variants": GRPO_VARIANTS,
            },
            "sft": {**base, **dpo, "kind": "sft", "variants": quick(SFT_VARIANTS)},
        }
    dpo = dict(shape="0.5b", steps=10, batch=8, side_tokens=800, seq_len=800)
    return {
        "exact": base,
        "dpo": {**base, **dpo, "kind": "dpo", "variants": DPO_VARIANTS},
        "dpo_large": {**base, **dpo, "shape": "1.5b", "kind": "dpo", "variants": LARGE_VARIANTS},
        "grpo": {
            **base,
            "kind": "grpo",
            "shape": "0.5b",
            "steps": 4,
            "batch": 16,
            "generations": 8,
            "new_tokens": 64,
            "prompt_tokens": 64,
            "seq_len": 128,
            "variants": GRPO_VARIANTS,
        },
        "sft": {**base, **dpo, "kind": "sft", "steps": 8, "variants": SFT_VARIANTS},
    }


def section_seconds(section: str, later: list[str], remaining: float) -> float:
    """The seconds `section` may take: what is left of the budget times its share (SECONDS) of the sections
    still to run (it and `later`). The exact section is one child, all or nothing (cut, it reports no path):
    under a smaller --budget it still gets its expected seconds while the budget has them."""
    share = remaining * SECONDS[section] / sum(SECONDS[s] for s in [section, *later])
    return max(share, min(remaining, SECONDS[section])) if section == "exact" else share


def no_device(device: str) -> str | None:
    """Why this run cannot measure (one line), or None: the GPU run on a machine without CUDA."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        return (
            "benchmarks/gpu.py: no CUDA GPU here (torch.cuda.is_available() is False); run it on a GPU "
            "machine, or pass --device cpu --tiny for the CPU dry run"
        )
    return None


def child(cfg: dict[str, Any], timeout: float) -> tuple[dict[str, Any] | None, float, str]:
    """Run benchmarks/gpu_sides.py with `cfg`: (its JSON line or None, wall seconds, stderr's tail)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, str(HERE / "gpu_sides.py"), json.dumps(cfg)],
            capture_output=True,
            text=True,
            timeout=max(timeout, 30),
            cwd=str(ROOT),
        )
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - t0, f"timed out after {timeout:.0f} s"
    seconds = time.perf_counter() - t0
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return None, seconds, proc.stderr[-2000:]
    return json.loads(lines[-1]), seconds, ""


def timed(name: str, cfg: dict[str, Any], repeats: int, remaining: float) -> dict[str, Any]:
    """TRL and ablate alternated (`repeats` rounds); one table; each side's variants as rows."""
    results: dict[str, list[dict[str, Any]]] = {}
    errors: dict[str, str] = {}
    # each ablate variant its own process: on the H200 (2026-12-04) ten variants in one process ran past the
    # section's time and every ablate number was lost; one that hangs now costs at most 3x TRL's process time
    children = [("trl", {})] + [
        (f"ablate:{v}", {"variants": {v: spec}}) for v, spec in cfg["variants"].items()
    ]
    for _ in range(repeats):
        trl_seconds = None
        for key, extra in children:
            side = "trl" if key == "trl" else "ablate"
            if remaining <= 0:
                errors.setdefault(key, "not started: past the section's time")
                continue
            cap = remaining if trl_seconds is None else min(remaining, max(60.0, 3 * trl_seconds))
            out, seconds, err = child({**cfg, **extra, "side": side}, cap)
            remaining -= seconds
            trl_seconds = seconds if key == "trl" and out is not None else trl_seconds
            if out is None:
                errors[key] = err.strip().splitlines()[-1] if err.strip() else "failed"
                continue
            for variant, r in out.items():
                key = "trl" if side == "trl" else f"ablate:{variant}"
                if "error" in r:
                    errors[key] = r["error"]
                else:
                    results.setdefault(key, []).append({**r, "process_seconds": seconds})
    rows = harness.summarize(results) if results else []
    title = f"{name} {cfg['shape']} {'bf16' if cfg['bf16'] else 'fp32'}"
    print(harness.format_table(f"{title} ({cfg['device']})", rows))
    for key, err in errors.items():
        print(f"  {key}: not run: {err}")
    return {"title": title, "rows": rows, "errors": errors, "runs": results}


def smoke_lines(device: str, only: set[str] | None = None) -> list[tuple[str, list[str]]]:
    """The smoke lines this run takes: those a CPU runs (on a CPU), those named by --only (if given)."""
    return [(n, o) for n, o, on_cpu in SMOKE if (device != "cpu" or on_cpu) and (not only or n in only)]


def keep_only(cfgs: dict[str, dict[str, Any]], only: set[str] | None) -> dict[str, dict[str, Any]]:
    """Each timed section with the ablate variants --only names (all without --only); TRL always runs."""
    return {
        k: {**c, "variants": {v: x for v, x in c["variants"].items() if v in only}}
        if only and "variants" in c
        else c
        for k, c in cfgs.items()
    }


def smoke(
    device: str, tiny: bool, out_dir: Path, parallel: int, remaining: float, only: set[str] | None = None
) -> dict[str, Any]:
    """The smoke lines, `parallel` at a time: one line each (status, key metric, seconds); a line that would
    start after `remaining` seconds is not started (and says so)."""
    lines = smoke_lines(device, only)
    steps = 2 if tiny else 10
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    deadline = time.perf_counter() + remaining

    def run(name: str, overrides: list[str]) -> tuple[str, int | None, float]:
        t0 = time.perf_counter()
        remaining = deadline - t0
        if remaining <= 0:
            return name, None, 0.0
        cmd = [
            sys.executable,
            "-m",
            "ablate",
            "train",
            *overrides,
            f"method.args.max_steps={steps}",
            f"hydra.run.dir={out_dir / name}",
        ]
        with open(out_dir / f"{name}.log", "w") as log:
            try:
                rc = subprocess.run(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=str(out_dir),
                    timeout=max(remaining, 60),
                ).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        return name, rc, time.perf_counter() - t0

    out_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        for name, rc, seconds in pool.map(lambda x: run(*x), lines):
            results[name] = smoke_line(out_dir / name, name, rc, seconds)
    return results


def smoke_line(run_dir: Path, name: str, rc: int | None, seconds: float) -> dict[str, Any]:
    if rc is None:
        print(f"{name:14} not started: past the section's time", flush=True)
        return {"rc": None, "status": "not started", "seconds": 0.0}
    try:
        s = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError) as e:
        s = {"status": f"no summary ({type(e).__name__})"}
    metrics = s.get("metrics", {})
    key = next((k for k in ("rewards/accuracies", "reward", "loss") if k in metrics), None)
    print(
        f"{name:14} rc={rc} status={s.get('status')} {key}={metrics.get(key)} steps={s.get('global_step')} "
        f"{seconds:.0f}s" + (f" error={s.get('error')}" if s.get("error") else ""),
        flush=True,
    )
    return {"rc": rc, "status": s.get("status"), "seconds": seconds, key or "metric": metrics.get(key)}


def verdicts(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per path: exact (the exact section) and speedup over speed=off (dpo: DPO's paths, grpo: GRPO's)."""
    exact = (out.get("exact") or {}).get("paths", {})
    paths: dict[str, dict[str, Any]] = {}
    for section, names in (("dpo", (*DPO_PATHS, "forced+liger", "forced+compile")), ("grpo", GRPO_PATHS)):
        rows = {r["impl"]: r for r in (out.get(section) or {}).get("rows", [])}
        off = rows.get("ablate:off")
        for name in names:
            row, path = rows.get(f"ablate:{name}"), name.split("+")[-1]
            base = rows.get("ablate:forced") if "+" in name else off
            if row is None or base is None or path not in exact:
                continue
            speedup = base["s_per_step"] / row["s_per_step"]
            paths[path] = {
                "exact": bool(exact[path].get("exact")),
                "max_abs_diff": exact[path].get("max_abs_diff"),
                "speedup": round(speedup, 3),
                "basis": f"{out[section].get('title', section)}: {row['s_per_step']:.3f} s/step against "
                f"{'forced' if '+' in name else 'speed=off'}'s {base['s_per_step']:.3f} ({speedup:.2f}x)",
            }
    return paths


def header(device: str) -> str:
    import platform

    import torch
    import transformers
    import trl

    name = (
        torch.cuda.get_device_name(0)
        if device == "cuda" and torch.cuda.is_available()
        else platform.processor()
    )
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    return (
        f"benchmarks/gpu.py on {name or device}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"trl {trl.__version__}, {time.strftime('%Y-%m-%d')}, commit {sha or '?'}"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="tiny shapes (seconds per section on a CPU)")
    p.add_argument(
        "--sections", help="default: exact,dpo,smoke,grpo,sft,dpo_large (--tiny: no dpo_large, the same code)"
    )
    p.add_argument("--budget", type=float, default=470.0, help="seconds: a section starting later is skipped")
    p.add_argument("--repeats", type=int, default=1, help="alternated rounds of TRL and ablate per section")
    p.add_argument("--parallel", type=int, default=8, help="smoke lines at a time")
    p.add_argument(
        "--smoke-dir",
        type=Path,
        default=Path("outputs/gpu_smoke") / time.strftime("%Y%m%d-%H%M%S"),
        help="the smoke runs' dirs (a fresh one per run: an existing run dir would be resumed)",
    )
    p.add_argument("--compile", action="store_true", help="exact: check torch.compile on a CPU too (minutes)")
    p.add_argument(
        "--only",
        help="comma-separated ablate variants and smoke lines to run (default: all); "
        "a short GPU lease runs the decisive rows: --only off,forced,bf16_tf32",
    )
    p.add_argument("--out", type=Path, help="write every number here (JSON)")
    p.add_argument(
        "--record",
        nargs="?",
        const=str(ROOT / "src/ablate/speed/measured.json"),
        help="write the verdicts as the device's entry of this measured.json (default: ablate's)",
    )
    a = p.parse_args()
    if (
        a.tiny
        and a.record
        and Path(a.record).resolve() == (ROOT / "src/ablate/speed/measured.json").resolve()
    ):
        p.error("--tiny decides nothing for ablate's defaults: give --record a path of its own")
    sections = (a.sections or ("exact,dpo,grpo,sft,smoke" if a.tiny else ",".join(SECONDS))).split(",")
    if unknown := sorted(set(sections) - set(SECONDS)):
        p.error(f"--sections: unknown {', '.join(unknown)}; choose from {', '.join(SECONDS)}")
    if reason := no_device(a.device):
        print(reason, file=sys.stderr)
        sys.exit(2)
    t0, run = time.perf_counter(), header(a.device)
    print(run, flush=True)
    only = set(a.only.split(",")) if a.only else None
    cfgs, out = keep_only(configs(a.device, a.tiny), only), {"run": run}
    for i, section in enumerate(sections):
        remaining = a.budget - (time.perf_counter() - t0)
        if remaining <= 0:
            print(f"\n{section}: skipped (past --budget {a.budget:.0f} s)")
            continue
        remaining = section_seconds(section, sections[i + 1 :], remaining)
        print(f"\n== {section} ({remaining:.0f} s of the budget) ==", flush=True)
        s0 = time.perf_counter()
        if section == "exact":
            got, _, err = child({**cfgs["exact"], "kind": "exact", "compile": a.compile}, remaining)
            out["exact"] = got or {"error": err}
            print_exact(out["exact"])
        elif section == "smoke":
            out["smoke"] = smoke(a.device, a.tiny, a.smoke_dir.resolve(), a.parallel, remaining, only)
        else:
            out[section] = timed(section, cfgs[section], a.repeats, remaining)
        print(f"({section}: {time.perf_counter() - s0:.0f} s)", flush=True)
    out["verdicts"] = verdicts(out)
    print("\nverdicts (exact and not slower than speed=off: on by default for this device with --record):")
    for name, v in out["verdicts"].items():
        from ablate.speed.measured import verdict

        print(
            f"  {name:24} {'on ' if verdict(v['exact'], v['speedup']) else 'off'} exact={v['exact']} {v['basis']}"
        )
    if a.out:
        a.out.write_text(json.dumps(out, indent=1, default=str))
    if a.record:
        from ablate.speed import measured

        print(f"recorded: {measured.write(a.device, run, out['verdicts'], Path(a.record))}")
    print(f"total {time.perf_counter() - t0:.0f} s")


def print_exact(res: dict[str, Any]) -> None:
    if "paths" not in res:
        print(f"exact: failed: {res.get('error', '')[-1500:]}")
        return
    print(
        f"measured peak: bf16 {res['peak_bf16'] / 1e12:.1f} TFLOP/s, fp32 {res['peak_fp32'] / 1e12:.1f} TFLOP/s"
    )
    print(f"{'path':24} {'exact':6} {'max |dlogp|':>12} {'grad rel':>10}")
    for name, r in res["paths"].items():
        d, g = r.get("max_abs_diff"), r.get("grad_rel_diff")
        print(
            f"{name:24} {str(r['exact']):6} {('-' if d is None else f'{d:.2e}'):>12} "
            f"{('-' if g is None else f'{g:.2e}'):>10} {r.get('identical_completions', '')}{r.get('error', '')}"
        )


if __name__ == "__main__":
    main()
