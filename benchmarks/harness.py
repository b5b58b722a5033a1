"""Shared benchmark harness: implementations run alternately (A B A B ...), each in its own subprocess
(so peak memory and start-up are its own), and one table compares them.

Child side, inside the process being measured (the script's `--child IMPL` branch):

    rec = StepRecorder()                         # a TrainerCallback: per-step seconds, losses, tokens
    trainer = SomeTrainer(..., callbacks=[rec])
    trainer.train()
    report(rec, model, trainer.args)             # one JSON line on stdout (the last line)

Parent side:

    results = run_alternately({"ablate": [sys.executable, __file__, "--child", "ablate", ...],
                               "trl": [sys.executable, __file__, "--child", "trl", ...]}, repeats=3)
    print_table("DPO, 33.7M Llama, batch 8, bf16", results)

Columns: median seconds per optimizer step (all steps of all repeats but each run's first, which
carries warm-up), whole-process seconds (median; start-up, data preparation and any reference
precompute included), tokens/s at the median step, MFU (ablate.speed.throughput: 6N FLOPs per trained token, 2N
per generated one, against the peak that ablate measures and caches per machine, or `peak_tflops`),
HW MFU (the FLOPs the training forwards and backwards actually computed: 6N per position through the
model, padding included, the LM head's share only for the rows it projected, `StepRecorder.watch`,
ablate's fused head included; TRL's fused LM head bypasses the head module: its children add
`StepRecorder.watch_trl_fused_head`),
peak RSS (max over repeats), and the largest per-step loss difference from the first implementation.
The load average is printed with the table, and each run's CPU steal (the share of the CPUs' time the
hypervisor gave to other guests while it ran, from /proc/stat): on a shared machine, numbers are only
comparable within one table, and a run with steal has lost wall-clock to its neighbours (more so a
side whose threads wait on each other at every operation). Run by hand; the tests check the harness, never the timings.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

try:  # the child side needs transformers; the parent side is plain arithmetic on the children's JSON
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - a parent without transformers still prints tables
    TrainerCallback = object  # type: ignore[assignment,misc]


class StepRecorder(TrainerCallback):  # type: ignore[misc,valid-type]
    """Per optimizer step: seconds since the previous step ended (the first since training began),
    the logged loss, gradient norm and (GRPO) reward (set `logging_steps=1`: the reward is the sum of the
    logged `rewards/NAME/mean`, TRL's and ablate's key), and `num_input_tokens_seen` after the step."""

    def __init__(self) -> None:
        self.step_seconds: list[float] = []
        self.losses: list[float] = []
        self.grad_norms: list[float] = []
        self.rewards: list[float] = []
        self.tokens: list[int] = []
        self._last = 0.0
        self.computed = {"tokens": 0, "head_rows": 0}  # what training forwards computed (`watch`)

    def watch(self, model: Any) -> None:
        """Count what the hardware computes in every forward that builds a graph (training; not
        no-grad precompute or eval): positions through the embedding, padding included (so through
        every layer), and rows through the LM head. Implementation-agnostic: hooks on the modules."""

        def count(key: str, per_row: int) -> Any:
            def hook(module: Any, inputs: tuple) -> None:
                import torch

                if torch.is_grad_enabled():
                    self.computed[key] += inputs[0].numel() // per_row

            return hook

        model.get_input_embeddings().register_forward_pre_hook(count("tokens", 1))
        head = model.get_output_embeddings()
        head.register_forward_pre_hook(count("head_rows", head.weight.shape[1]))
        self._watch_ablate_head()

    def _watch_ablate_head(self) -> None:
        """ablate's `completion_only_logits` projects through `ablate.speed.head.HeadLogps` (the head's
        weight in a custom autograd function, never the module's call): count its rows (with grad)."""
        from ablate.speed import head

        self._count_rows(head, "HeadLogps")

    def watch_trl_fused_head(self) -> None:
        """TRL 1.16's DPO and GRPO trainers score through a fused LM head (`add_fused_lm_head`): the
        backbone's hidden states times `lm_head.weight` in a custom autograd function, never the head
        module's call, so `watch` sees no head rows. Count its rows (with grad) here; on CPU it projects
        every position of every row, prompt and padding included. Call in TRL's children (imports trl)."""
        from trl.trainer import utils

        self._count_rows(utils, "_ChunkedLogProbFunction")

    def _count_rows(self, module: Any, name: str) -> None:
        """Replace the autograd function `module.name` (applied to hidden states [rows, H] first) by one
        that adds its rows to `computed["head_rows"]` when it runs with grad, then applies it."""
        import torch

        fused, computed = getattr(module, name), self.computed

        class Counted:
            @staticmethod
            def apply(hidden: Any, *args: Any) -> Any:
                if torch.is_grad_enabled():
                    computed["head_rows"] += hidden.shape[0]
                return fused.apply(hidden, *args)

        setattr(module, name, Counted)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._last = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        self.step_seconds.append(now - self._last)
        self._last = now
        self.tokens.append(int(state.num_input_tokens_seen or 0))

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if not logs or "loss" not in logs:  # the end-of-training summary logs train_loss, not loss
            return
        self.losses.append(float(logs["loss"]))
        if logs.get("grad_norm") is not None:
            self.grad_norms.append(float(logs["grad_norm"]))
        means = [float(v) for k, v in logs.items() if k.startswith("rewards/") and k.endswith("/mean")]
        if means:
            self.rewards.append(sum(means))


def report(
    rec: StepRecorder,
    model: Any,
    args: Any,
    tokens: int | None = None,
    generated_tokens: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    """Print the child's result as one JSON line (and return it). `tokens`: tokens trained on, when
    the trainer does not count them in `num_input_tokens_seen`; `generated_tokens`: GRPO's samples."""
    from ablate.speed import throughput as speed

    out = {
        "step_seconds": rec.step_seconds,
        "losses": rec.losses,
        "grad_norms": rec.grad_norms,
        "rewards": rec.rewards,
        "tokens": tokens if tokens is not None else (rec.tokens[-1] if rec.tokens else 0),
        "generated_tokens": generated_tokens,
        "flops_per_token": speed.flops_per_token(model),
        "computed": rec.computed,
        "head_params": model.get_output_embeddings().weight.numel(),
        "peak_flops": speed.peak_flops(args.device, speed.run_dtype(args)),  # after training: not timed
        "device": speed.device_key(args.device, speed.run_dtype(args)),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        **extra,
    }
    print(json.dumps(out), flush=True)
    return out


def run_alternately(
    commands: dict[str, list[str]], repeats: int, env: dict[str, str] | None = None, timeout: float = 1800
) -> dict[str, list[dict[str, Any]]]:
    """Run each command `repeats` times, alternating (A B A B ...); each result is the child's last
    stdout line (JSON) plus `process_seconds`, its whole process's wall-clock."""
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, cmd in commands.items():
            t0, ticks = time.perf_counter(), cpu_ticks()
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
            )
            seconds = time.perf_counter() - t0
            if proc.returncode != 0:
                raise RuntimeError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            result["process_seconds"] = seconds
            result["steal"] = steal_fraction(ticks, cpu_ticks())
            results[name].append(result)
    return results


def summarize(results: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per implementation (raw numbers; `print_table` formats them)."""
    rows = []
    first = next(iter(results.values()))[0] if results else {}
    # the workload's tokens per step: an implementation whose trainer does not count them uses another's
    counted = [
        r["tokens"] / len(r["step_seconds"])
        for runs in results.values()
        for r in runs
        if r.get("tokens") and r.get("step_seconds")
    ]
    for name, runs in results.items():
        steady = [s for r in runs for s in (r["step_seconds"][1:] or r["step_seconds"])]
        step = statistics.median(steady)
        own = [r["tokens"] / len(r["step_seconds"]) for r in runs if r.get("tokens")]
        tokens = statistics.median(own or counted) if (own or counted) else 0.0
        generated = statistics.median(r.get("generated_tokens", 0) / len(r["step_seconds"]) for r in runs)
        fpt, peak = runs[0]["flops_per_token"], runs[0]["peak_flops"]
        flops = fpt * tokens + fpt / 3 * generated
        # hardware FLOPs: 6N per position the training forwards actually computed (padding included),
        # the head's share only for the rows it projected; attention's T-dependent term left out
        computed, head = runs[0].get("computed") or {}, runs[0].get("head_params", 0)
        hw = (
            6
            * ((fpt / 6 - head) * computed.get("tokens", 0) + head * computed.get("head_rows", 0))
            / len(runs[0]["step_seconds"])
            if computed.get("tokens")
            else None
        )
        losses = runs[0]["losses"]
        diff = max_diff(first.get("losses"), losses)
        rows.append(
            {
                "impl": name,
                "s_per_step": step,
                "process_s": statistics.median(r["process_seconds"] for r in runs),
                "tokens_per_s": tokens / step if step else 0.0,
                "tokens_counted": bool(own),
                "mfu": flops / step / peak if step and peak else None,
                "hw_mfu": hw / step / peak if hw and step and peak else None,
                "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
                "max_loss_diff": diff,
                "max_reward_diff": max_diff(first.get("rewards"), runs[0].get("rewards")),
                "max_grad_norm_rel": max_diff(
                    first.get("grad_norms"), runs[0].get("grad_norms"), relative=True
                ),
                "gpu_peak_mb": max(
                    (r["gpu_peak_mb"] for r in runs if r.get("gpu_peak_mb") is not None), default=None
                ),
                "steps": len(losses),
                "repeats": len(runs),
            }
        )
    return rows


def max_diff(base: list[float] | None, other: list[float] | None, relative: bool = False) -> float | None:
    """The largest per-step |base - other| (relative: over |base|) over the steps both logged; None when
    either logged none (a trainer that logs no reward, a run from before the recorder logged gradient norms)."""
    pairs = list(zip(base or [], other or []))
    if not pairs:
        return None
    return max(abs(a - b) / (max(abs(a), 1e-12) if relative else 1.0) for a, b in pairs)


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine() -> str:
    """The machine line printed under each table."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu}, {cores} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, Python {platform.python_version()}"


def cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) clock ticks of all CPUs since boot (/proc/stat's `cpu` line); None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    steal = fields[7] if len(fields) > 7 else 0
    return steal, sum(
        fields[:8]
    )  # user nice system idle iowait irq softirq steal (guest time is inside user)


def steal_fraction(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the CPUs' ticks between two `cpu_ticks()` readings stolen by the hypervisor."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def format_table(title: str, rows: list[dict[str, Any]]) -> str:
    """The table; a "GPU peak MB" column (torch.cuda.max_memory_allocated) where the runs report one, and
    the per-step agreement with the first row: loss, then reward (GRPO) and gradient norm (relative) where
    the runs logged them."""
    gpu = any(r.get("gpu_peak_mb") is not None for r in rows)
    agree = [
        (k, head)
        for k, head in (
            ("max_loss_diff", "max |dloss|"),
            ("max_reward_diff", "max |dreward|"),
            ("max_grad_norm_rel", "grad-norm rel"),
        )
        if any(r.get(k) is not None for r in rows)
    ]
    width = max([10, *(len(r["impl"]) for r in rows)])
    lines = [
        title,
        f"{'impl':{width}} {'s/step':>9} {'process s':>10} {'tokens/s':>10} {'MFU':>7} {'HW MFU':>7} "
        f"{'peak RSS MB':>12}"
        + (f" {'GPU peak MB':>12}" if gpu else "")
        + "".join(f" {head:>13}" for _, head in agree),
    ]
    for r in rows:
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        hw = f"{r['hw_mfu']:.1%}" if r.get("hw_mfu") is not None else "-"
        diffs = ["-" if r.get(k) is None else ("(base)" if r is rows[0] else f"{r[k]:.2e}") for k, _ in agree]
        tps = f"{r['tokens_per_s']:.0f}" + ("" if r["tokens_counted"] else "*")
        mem = (
            (f" {r['gpu_peak_mb']:12.0f}" if r.get("gpu_peak_mb") is not None else f" {'-':>12}")
            if gpu
            else ""
        )
        lines.append(
            f"{r['impl']:{width}} {r['s_per_step']:9.4f} {r['process_s']:10.2f} {tps:>10} {mfu:>7} {hw:>7} "
            f"{r['peak_rss_mb']:12.0f}{mem}" + "".join(f" {d:>13}" for d in diffs)
        )
    if not all(r["tokens_counted"] for r in rows):
        lines.append("* tokens per step counted by another implementation (same data and batches)")
    steps, repeats = (rows[0]["steps"], rows[0]["repeats"]) if rows else (0, 0)
    lines.append(
        f"median of {repeats} alternated runs of {steps} steps; first step of each run left out of s/step"
    )
    return "\n".join(lines)


def print_table(title: str, results: dict[str, list[dict[str, Any]]], load_before: str | None = None) -> None:
    """The table, then the machine it ran on (CPU, the children's device and dtype) and the load average."""
    print(format_table(title, summarize(results)))
    devices = sorted({r["device"] for runs in results.values() for r in runs if r.get("device")})
    print(f"machine: {machine()}" + (f"; device: {', '.join(devices)}" if devices else ""))
    print(
        f"load average (1, 5, 15 min): {load_before + ' before, ' if load_before else ''}{load_average()} after"
    )
    steal = [r["steal"] for runs in results.values() for r in runs if r.get("steal") is not None]
    if steal:
        print(f"CPU steal per run (the hypervisor's, /proc/stat): {min(steal):.0%} to {max(steal):.0%}")


def record_cpu(
    results: dict[str, list[dict[str, Any]]],
    pairs: dict[str, tuple[str, str]],
    cpu_step: Any,
    what: str,
    path: str | None = None,
) -> str:
    """`--record`: write each path of `pairs` (name -> (the side without it, the side with it)) into this CPU
    family's record of ablate's measured.json (ablate.speed.measured, keeping the family's other paths and the
    other families): speedup = CPU s/step without / with (`cpu_step(runs)`: one thread's CPU seconds, what a
    shared machine barely moves), exact = the two sides' per-step losses within EXACT_ATOL. Returns what it wrote."""
    from datetime import date

    from ablate.speed import measured

    family = measured.cpu_family()
    old = next(
        (r for r in (measured.records().get("cpu") or {}).get("families", []) if r.get("family") == family),
        {},
    )
    paths = {
        name: {k: v for k, v in rec.items() if k != "on"} for name, rec in (old.get("paths") or {}).items()
    }
    lines = []
    for name, (without, with_) in pairs.items():
        a, b = results[without], results[with_]
        diff = max((abs(x - y) for x, y in zip(a[0]["losses"], b[0]["losses"])), default=float("inf"))
        speedup = cpu_step(a) / cpu_step(b)
        paths[name] = {
            "exact": diff <= measured.EXACT_ATOL,
            "max_abs_diff": diff,
            "speedup": round(speedup, 3),
            "basis": f"{what}: {cpu_step(b):.2f} vs {cpu_step(a):.2f} CPU s/step ({without})",
        }
        lines.append(f"  {name:24} {speedup:.2f}x  max |dloss| {diff:.2g}")
    import torch

    run = (
        f"benchmarks/dpo_vs_trl.py, grpo_vs_trl.py --record: {cpu_name()}, torch {torch.__version__}, "
        f"{date.today()} (docs/benchmarks.md)"
    )
    measured.write("cpu", run, paths, path=Path(path) if path else None, family=family)
    return f"recorded for {measured.describe(family)} in {path or measured.RECORD}:\n" + "\n".join(lines)
