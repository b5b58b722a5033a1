"""Throughput and MFU in every run: FLOPs per token, the device's peak, and the callback that logs them.

MFU (model FLOPs utilisation, Chowdhery et al. 2022, PaLM appendix B) = the FLOPs the model's matmuls
need for the tokens it processed / (seconds * the device's peak FLOP/s). Defined here as:

- tokens: the non-padding tokens of each training batch in TRL's layout
  (`TrainerState.num_input_tokens_seen`): DPO counts chosen and rejected rows, the prompt in each
  (TRL's `num_tokens`), whichever layout computes them, so tokens/s and MFU compare across layouts and
  with TRL; DPO's `share_prompt` computes each prompt once, so the FLOPs it actually computes are
  fewer (benchmarks/ report those too, as "HW MFU"); SFT its rows; GRPO the prompt and completion
  tokens of each training micro-batch.
- FLOPs: 6 * N per trained token (forward 2N, backward 4N); for GRPO also 2 * N per *generated*
  token (one forward each; the prompt's prefill and the scoring forwards for the reference or old
  policy are not counted, so GRPO's MFU is a lower bound).
- seconds: the training steps' wall-clock (data, forward, backward, optimizer, GRPO's generation),
  without evaluation and checkpoint saves.

The attention term (12 * L * d_attn * T per token) is left out of the per-run number (the callback
does not see sequence lengths): it is < ~7% at T <= 256 for the models here, so the MFU is a slight
underestimate. `flops_per_token(model, seq_len=T)` includes it where T is known (benchmarks).

Imports torch only inside functions; `ablate compare` reads the logged numbers without this module.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ablate.rollouts.stats import ReportsRollouts, RolloutStats

PEAK_CACHE = "peak_flops.json"  # in ablate's cache dir: the probe's result per machine/device/dtype


def matmul_params(model: Any) -> int:
    """N: weights that multiply activations (every `nn.Linear`, the lm_head included), not embeddings.

    The input embedding is a table lookup (no FLOPs), so it is left out, as in Kaplan et al. 2020
    (`N` excludes embeddings). The lm_head is a real [hidden x vocab] matmul on every token, and it
    is counted even when tied to the input embedding (tying shares the weight, not the work); for
    small models with large vocabularies it is a large share of the compute (SmolLM2-135M: ~28M of
    ~135M). Counted from the module's shape (in_features * out_features), so quantized layers, whose
    packed weight has fewer elements, count the matmul they compute.
    """
    from torch import nn

    total = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            total += module.in_features * module.out_features
        elif type(module).__name__ == "Conv1D" and hasattr(module, "weight"):  # GPT-2's Linear, transposed
            total += module.weight.shape[0] * module.weight.shape[1]
    return total


def flops_per_token(model: Any, seq_len: int = 0) -> float:
    """Training FLOPs per token: 6 * N (Kaplan et al. 2020, eq. 2.1; PaLM appendix B), plus attention's
    12 * L * d_attn * T when `seq_len` T is given (PaLM's 12 * L * H * Q * T: QK^T and attention * V,
    forward and backward, with d_attn = H * Q = query heads * head dim).

    Hand arithmetic for a tiny Llama (hidden 8, intermediate 16, 2 layers, 2 heads of dim 4, 1 KV
    head, vocab 32, tied embeddings):
        per layer: q 8*8=64, k 8*4=32, v 8*4=32, o 8*8=64, gate 8*16=128, up 128, down 16*8=128 -> 576
        N = 2 * 576 + lm_head 8*32=256 = 1408;  6N = 8448
        attention at T=10: 12 * 2 * (2*4) * 10 = 1920  ->  10368
    (norms, rotary embeddings, softmax and the loss are O(d) per token: left out, as in both papers).
    """
    flops = 6.0 * matmul_params(model)
    if seq_len:
        config = getattr(model, "config", None)
        layers = getattr(config, "num_hidden_layers", 0) or 0
        heads = getattr(config, "num_attention_heads", 0) or 0
        head_dim = getattr(config, "head_dim", None) or (getattr(config, "hidden_size", 0) // max(heads, 1))
        flops += 12.0 * layers * heads * head_dim * seq_len
    return flops


# ---- the device's peak ----


def cache_path() -> Path:
    from ablate.paths import cache_root

    return cache_root() / PEAK_CACHE


def device_key(device: Any, dtype: Any) -> str:
    """What the probe's result depends on: machine, device (its name on CUDA), dtype, torch, threads."""
    import torch

    from ablate.models.precision import tf32_matmul

    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    # torch's new API (ablate.models.precision)
    tf32 = "+tf32" if device.type == "cuda" and tf32_matmul(torch) else ""
    return (
        f"{socket.gethostname()}|{name}|{str(dtype).replace('torch.', '')}{tf32}|torch {torch.__version__}"
        f"|threads {torch.get_num_threads()}"
    )


def probe(device: Any, dtype: Any, seconds: float = 1.0) -> float:
    """The device's matmul FLOP/s in `dtype`: the best of repeated square matmuls over ~`seconds`
    (a dense matmul is the best case any model step can reach; the first call warms up)."""
    import torch

    device = torch.device(device)
    n = 4096 if device.type == "cuda" else 1024  # big enough to keep the device busy, small enough for ~1 s
    # not torch's global RNG: a run's draws must not depend on a cache miss
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(device=device, dtype=dtype) for _ in range(2))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    torch.mm(a, b)
    sync()
    best, start, reps = 0.0, time.perf_counter(), 1
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        sync()
        dt = time.perf_counter() - t0
        best = max(best, 2.0 * n**3 * reps / dt)
        if dt < 0.02:  # too short to time well: batch more matmuls per measurement
            reps *= 2
    return best


# fp32 FLOP/s below which no device of its class runs a dense matmul: any x86-64/ARM core of the last
# decade does several GFLOP/s, any CUDA GPU torch supports more than a TFLOP/s. A probe below it was
# taken while other work held the device (or is broken): it is measured again, and never cached.
FLOORS = {"cpu": 1e9, "cuda": 1e12}


def _plausible(value: float, device: Any, dtype: Any) -> bool:
    """At least the device class's fp32 floor (`FLOORS`); a CPU's bf16/fp16 may well be slower
    (emulated where the CPU has no such units), so only its fp32 figure is held to the floor."""
    import torch

    kind = torch.device(device).type
    if kind == "cpu" and dtype != torch.float32:
        return value > 0
    return value >= FLOORS.get(kind, 0.0)


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return cached if isinstance(cached, dict) else {}


def _entry(value: Any) -> dict[str, Any]:
    """A cache entry: {flops, idle (a probe ran on an otherwise idle machine), probes}; an older ablate's
    bare number is taken as it was, final."""
    if isinstance(value, (int, float)):
        return {"flops": float(value), "idle": True, "probes": 1}
    if isinstance(value, dict) and isinstance(value.get("flops"), (int, float)):
        return {
            "flops": float(value["flops"]),
            "idle": bool(value.get("idle")),
            "probes": int(value.get("probes", 1)),
        }
    return {"flops": 0.0, "idle": False, "probes": 0}


def _write_cache(path: Path, key: str, entry: dict[str, Any]) -> None:
    cached = _read_cache(path)
    cached[key] = entry
    try:  # atomic: parallel runs may write at once (a lost entry is only probed again)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(cached, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:  # a read-only cache: measure again next time
        pass


BUSY_CORES = 0.5  # other processes' CPU use during a probe (cores, on average) from which it is not idle
BUSY_PROBES = 3  # probes on a busy machine after which the best of them is kept for good


def probe_on(device: Any, dtype: Any, seconds: float = 1.0) -> tuple[float, bool]:
    """`probe`, and whether the machine was otherwise idle meanwhile: the CPU time every other process
    (and the hypervisor: steal) took during it, from psutil, under `BUSY_CORES`. A GPU's probe is taken
    as idle (its own clocks are not shared with the host's other processes)."""
    import psutil
    import torch

    if torch.device(device).type != "cpu":
        return probe(device, dtype, seconds), True
    me, t0 = psutil.Process(), time.perf_counter()
    mine, every = me.cpu_times(), psutil.cpu_times()
    flops = probe(device, dtype, seconds)
    wall = max(time.perf_counter() - t0, 1e-9)
    mine_now, every_now = me.cpu_times(), psutil.cpu_times()
    busy = sum(
        getattr(every_now, f, 0.0) - getattr(every, f, 0.0)
        for f in ("user", "nice", "system", "irq", "softirq", "steal")
    )
    own = (mine_now.user - mine.user) + (mine_now.system - mine.system)
    return flops, (busy - own) / wall < BUSY_CORES


def peak_flops(
    device: Any, dtype: Any, user_tflops: float | None = None, path: Path | None = None, at_least: float = 0.0
) -> float:
    """Peak FLOP/s of `device` in `dtype`: `user_tflops` (config `peak_tflops`) if given, else the
    cached probe for this machine, device, dtype, torch version and thread count, else a ~1 s probe
    whose result is cached (`$ABLATE_CACHE/peak_flops.json`, default ~/.cache/ablate/).

    A peak is a maximum, so the best probe is kept, and one taken while other processes used the CPU
    (`probe_on`) reads low: such an entry is probed again by the next runs, the higher figure kept,
    until a probe runs on an idle machine or `BUSY_PROBES` were taken (`peak_note` says which). Also
    probed again: a value implausible for the device class (`FLOORS`) or below `at_least` (FLOP/s a run
    actually reached: MFU above 100%). A bf16/fp16 figure below the same device's fp32 one (bf16
    emulated, as on CPUs without bf16 units) is not the device's peak: the fp32 figure is used, so MFU
    shows what the slow dtype costs."""
    import torch

    if user_tflops is not None:
        return float(user_tflops) * 1e12
    path = path or cache_path()
    key = device_key(device, dtype)
    entry = _entry(_read_cache(path).get(key))
    value = entry["flops"]
    settled = entry["idle"] or entry["probes"] >= BUSY_PROBES
    if not _plausible(value, device, dtype) or value < at_least or not settled:
        measured, idle = probe_on(device, dtype)
        if not _plausible(max(value, measured), device, dtype):  # a busy device: once more, longer
            again, idle = probe_on(device, dtype, seconds=3.0)
            measured = max(measured, again)
        value = max(value, at_least, measured)
        if _plausible(value, device, dtype):
            _write_cache(
                path, key, {"flops": value, "idle": entry["idle"] or idle, "probes": entry["probes"] + 1}
            )
        else:
            logging.getLogger("ablate").warning(
                "the peak-FLOPs probe read %.3g TFLOP/s, implausibly low for a %s (another job on it?): not "
                "cached; MFU is against it this run (set peak_tflops=... for a datasheet figure)",
                value / 1e12,
                torch.device(device).type,
            )
    if dtype != torch.float32:
        value = max(value, peak_flops(device, torch.float32, path=path))
    return value


def peak_note(device: Any, dtype: Any, user_tflops: float | None = None, path: Path | None = None) -> str:
    """How the peak MFU is read against was had, for the run's line and summary.json: set by the user,
    measured on an idle machine, or the best of the probes so far, each on a busy machine."""
    if user_tflops is not None:
        return "peak_tflops"
    path = path or cache_path()
    entry = _entry(_read_cache(path).get(device_key(device, dtype)))
    if entry["idle"]:
        return f"measured on an idle machine, cached in {path}"
    if entry["probes"] >= BUSY_PROBES:
        return f"the best of {entry['probes']} probes, all on a busy CPU: MFU may read high; cached in {path}"
    return (
        f"the best of {entry['probes']} probe(s) on a busy CPU, so far: MFU may read high; the next runs "
        f"probe again; cached in {path}"
    )


def fmt_flops(flops: float) -> str:
    """`8.69 GFLOP/s`, `989 TFLOP/s`: the peak as it is read next to MFU."""
    for scale, unit in ((1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops:.3g} FLOP/s"


def run_dtype(args: TrainingArguments) -> Any:
    """The dtype the run's matmuls use: bf16/fp16 autocast, else the float32 weights."""
    import torch

    return torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else torch.float32


# ---- the callback ----


class ThroughputCallback(TrainerCallback):
    """Adds `tokens_per_second` and `mfu` to every training log event (and, for GRPO, `time/generation`,
    `time/scoring` and `time/training`: seconds per optimizer step, averaged over the log window), and
    shows them on the progress bar. Always installed by `ablate.train`, first among the callbacks, so
    metrics.jsonl, W&B and the progress bar's log line all see them.

    Counts come from the trainer: `state.num_input_tokens_seen` (the tokens trained on; Trainer's own
    for DPO and SFT) and, from a trainer that generates its data (`ReportsRollouts`: GRPO), the
    generation and scoring seconds and generated tokens of its `rollout_stats()`.
    """

    def __init__(self, trainer: Any, peak_tflops: float | None = None) -> None:
        self.trainer = trainer
        self.peak_tflops = peak_tflops
        self.peak: float | None = None
        self.flops_per_token = flops_per_token(trainer.accelerator.unwrap_model(trainer.model))
        self.forward_flops_per_token = self.flops_per_token / 3  # 2N: generation is forward only
        self._last: float | None = None
        self.seconds = 0.0  # training-step seconds in the current log window
        self.total_seconds = self.total_flops = self.total_tokens = 0.0  # this process's, for summary.json
        self._marks: dict[str, float] = {}
        self._reprobed = False  # the peak was measured again after a log window beat it (once per run)
        self.peak_source = ""  # how the peak was had (peak_note), for summary.json

    def _counters(self, state: TrainerState) -> dict[str, float]:
        rollouts = (
            self.trainer.rollout_stats() if isinstance(self.trainer, ReportsRollouts) else RolloutStats()
        )
        return {
            "tokens": float(state.num_input_tokens_seen or 0),
            "step": float(state.global_step),
            "generated": float(rollouts.generated_tokens),
            "generation": float(rollouts.generation_seconds),
            "scoring": float(rollouts.scoring_seconds),
        }

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.peak is None:
            self.peak = peak_flops(args.device, run_dtype(args), self.peak_tflops)
            self.peak_source = peak_note(args.device, run_dtype(args), self.peak_tflops)
            if state.is_world_process_zero:
                logging.getLogger("ablate").info(
                    "MFU against a peak of %s (%s; set peak_tflops=... to override)",
                    fmt_flops(self.peak),
                    self.peak_source,
                )
        self._marks = self._counters(state)
        self._last = time.perf_counter()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        now = time.perf_counter()
        self.seconds += now - (self._last if self._last is not None else now)
        self._last = now

    def _restart_clock(self, *args: Any, **kwargs: Any) -> None:
        """Evaluation and checkpoint saves happen between steps: their time is not a step's."""
        self._last = time.perf_counter()

    on_evaluate = on_save = _restart_clock

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if logs is None or "loss" not in logs or self.seconds <= 0:  # eval and end-of-train events
            return
        now = self._counters(state)
        d = {k: now[k] - self._marks.get(k, 0.0) for k in now}
        steps, seconds = max(d["step"], 1.0), self.seconds
        world = max(args.world_size, 1)
        # tokens are counted over all processes; generated tokens per process (each generates its own batch)
        flops = self.flops_per_token * d["tokens"] / world + self.forward_flops_per_token * d["generated"]
        if d["tokens"] > 0:
            logs["tokens_per_second"] = d["tokens"] / seconds
            if self.peak and flops / seconds > self.peak and self.peak_tflops is None and not self._reprobed:
                self._raise_peak(args, flops / seconds, state.is_world_process_zero)
            if self.peak:
                logs["mfu"] = flops / seconds / self.peak
            # GRPO: Trainer cannot count its batches, the trainer does
            if "num_input_tokens_seen" not in logs:
                logs["num_input_tokens_seen"] = int(now["tokens"])
        if isinstance(self.trainer, ReportsRollouts):  # GRPO: where a step's time goes
            logs["time/generation"] = d["generation"] / steps
            logs["time/scoring"] = d["scoring"] / steps
            logs["time/training"] = max(seconds - d["generation"] - d["scoring"], 0.0) / steps
        self.total_seconds += seconds
        self.total_flops += flops
        self.total_tokens += d["tokens"]
        self._marks, self.seconds = now, 0.0
        self._show(state, logs)

    def _raise_peak(self, args: TrainingArguments, reached: float, main: bool) -> None:
        """This run computed faster than the cached peak: the cache was wrong (a probe on a busy
        machine). Measure again, keep the higher figure (cached for later runs), say so once."""
        self._reprobed = True
        old = self.peak or 0.0
        self.peak = peak_flops(args.device, run_dtype(args), at_least=reached)
        if main:
            logging.getLogger("ablate").info(
                "this run reached %s, above the cached peak of %s: measured again, MFU now against %s",
                fmt_flops(reached),
                fmt_flops(old),
                fmt_flops(self.peak),
            )

    def _show(self, state: TrainerState, logs: dict[str, Any]) -> None:
        """tokens/s and MFU, with the peak it is measured against, on the progress bar."""
        if "tokens_per_second" not in logs or not state.is_world_process_zero:
            return
        from transformers import ProgressCallback

        text = f"{logs['tokens_per_second']:.4g} tok/s"
        if "mfu" in logs and self.peak:
            text += f", MFU {logs['mfu']:.1%} of {fmt_flops(self.peak)}"
        for cb in self.trainer.callback_handler.callbacks:
            if isinstance(cb, ProgressCallback) and getattr(cb, "training_bar", None) is not None:
                if hasattr(cb, "show"):  # ablate.process.console.Progress: one postfix with the key metrics
                    cb.show("speed", text)
                else:
                    cb.training_bar.set_postfix_str(text, refresh=False)

    def summary_fields(self) -> dict[str, Any]:
        """For summary.json: this process's throughput and MFU over all its training steps, and the peak."""
        out: dict[str, Any] = {}
        if self.total_seconds > 0 and self.total_tokens > 0:
            out["tokens_per_second"] = round(self.total_tokens / self.total_seconds, 3)
            if self.peak:
                out["mfu"] = round(self.total_flops / self.total_seconds / self.peak, 6)
        if self.peak:
            out["peak_tflops"] = round(self.peak / 1e12, 6)
            # MFU compares across runs whose peaks were had alike (`ablate compare --metric speed`)
            if self.peak_source:
                out["peak_source"] = self.peak_source.split("; cached in")[0]
        return out
