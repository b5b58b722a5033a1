"""Side by side: ablate's GRPOTrainer vs TRL 1.16's on SmolLM2-135M-Instruct, same prompts and reward.

    python benchmarks/grpo_vs_trl.py [--steps 4] [--spg 1 4] [--batch 16] [--num-generations 8]
                                     [--new-tokens 64] [--repeats 2] [--impls ablate trl]

Both trainers get the same model dir (`ablate fetch smollm2_135m`), the packaged `one_word_prompts`
data (chat prompts, reward 1 / word count), the same geometry (`--batch` completions per optimizer
step, `--num-generations` per prompt, `--new-tokens` new tokens, `--spg` steps per generation round),
fp32, temperature 0.8, top_k 0 (off, TRL's default), lr 3e-5, beta 0, DAPO aggregation. Each run is its
own subprocess (peak RSS is its own); impls alternate, `--repeats` times (`--vary-seed`: repeat r uses
seed + r, and the per-step rewards of every run are printed: reward curves over seeds); the table shows
medians. CPU seconds per step (the process's, one thread: what a loaded machine does not inflate
much) and wall seconds are reported; CPU seconds per step are split into generation (the `generate`
call), scoring (the rest of the generation round: reward, old-policy log-probs when needed) and
training (forward + backward + optimizer) by wrapping each trainer's methods from outside.
`--impls ablate:hf` runs ablate with its plain `HFGenerator` (model.generate), `ablate:noshare` with
`share_prompt` off (training scores one row per completion instead of one per prompt). Not part of the test
run: numbers depend on the machine (the README records one set).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Callable


def _timed(obj: Any, name: str, box: dict[str, float], key: str) -> None:
    """Wrap obj.name so its wall time accumulates in box[key], its CPU time in box[key + "_cpu"]."""
    fn = getattr(obj, name)

    def wrapper(*a: Any, **kw: Any) -> Any:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return fn(*a, **kw)
        finally:
            box[key] += time.perf_counter() - t0
            box[key + "_cpu"] += time.process_time() - c0

    setattr(obj, name, wrapper)


def run_one(impl: str, steps: int, batch: int, g: int, spg: int, new_tokens: int, seed: int) -> dict:
    import torch
    from transformers import TrainerCallback

    from ablate.data import packaged
    from ablate.models import smollm2_135m
    from ablate.rewards.format import one_word

    torch.manual_seed(seed)
    tok, model = smollm2_135m(lean_layers=impl != "trl")  # TRL gets transformers' own RMSNorm and MLP
    train = packaged("one_word_prompts", with_eval=False).train
    common = dict(output_dir=f"/tmp/bench-grpo-{impl}-{os.getpid()}", per_device_train_batch_size=batch,
                  num_generations=g, steps_per_generation=spg, gradient_accumulation_steps=1, max_steps=steps,
                  max_completion_length=new_tokens, temperature=0.8, top_p=1.0, top_k=0, beta=0.0, learning_rate=3e-5,
                  lr_scheduler_type="constant", logging_steps=1, report_to="none", save_strategy="no",
                  use_cpu=True, bf16=False, seed=seed, disable_tqdm=True)
    box = {"generation": 0.0, "round": 0.0, "generation_cpu": 0.0, "round_cpu": 0.0}
    rewards: list[float] = []

    class Record(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
            for k, v in (logs or {}).items():
                if k.startswith("rewards/") and k.endswith("/mean"):
                    rewards.append(float(v))

    if impl == "trl":
        import trl

        trainer = trl.GRPOTrainer(model=model, reward_funcs=[one_word], train_dataset=train, processing_class=tok,
                                  args=trl.GRPOConfig(loss_type="dapo", **common), callbacks=[Record()])
        _timed(trainer, "_generate_single_turn", box, "generation")
        _timed(trainer, "_generate_and_score_completions", box, "round")
    else:
        from ablate.trainers.grpo import GRPOConfig, GRPOTrainer, HFGenerator

        args = GRPOConfig(**common, share_prompt=impl != "ablate:noshare")
        kw: dict[str, Any] = {"generator": HFGenerator(args, tok)} if impl == "ablate:hf" else {}
        trainer = GRPOTrainer(model=model, args=args, train_dataset=train, processing_class=tok,
                              reward_funcs={"one_word": one_word}, callbacks=[Record()], **kw)
        gen: Callable = trainer.generator
        trainer.generator = lambda m, p: gen(m, p)  # an instance attribute _timed can wrap
        _timed(trainer, "generator", box, "generation")
        _timed(trainer, "_generate_and_score", box, "round")
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"impl": impl, "spg": spg, "s_per_step": total / steps, "cpu_per_step": cpu / steps,
            "generation": box["generation_cpu"] / steps,
            "scoring": (box["round_cpu"] - box["generation_cpu"]) / steps,
            "training": (cpu - box["round_cpu"]) / steps,
            "rewards": rewards, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--spg", type=int, nargs="+", default=[1, 4])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vary-seed", action="store_true", help="repeat r runs seed + r (reward curves over seeds)")
    p.add_argument("--impls", nargs="+", default=["ablate", "trl"])
    p.add_argument("--child", help="internal: run one impl and print its JSON")
    a = p.parse_args()
    if a.child:
        print(json.dumps(run_one(a.child, a.steps, a.batch, a.num_generations, a.spg[0], a.new_tokens, a.seed)))
        return
    results: dict[tuple[str, int], list[dict]] = {}
    for spg in a.spg:
        for rep in range(a.repeats):
            for impl in a.impls:  # alternate: A B A B
                seed = a.seed + rep if a.vary_seed else a.seed
                out = subprocess.run([sys.executable, __file__, "--child", impl, "--steps", str(a.steps), "--spg",
                                      str(spg), "--batch", str(a.batch), "--num-generations", str(a.num_generations),
                                      "--new-tokens", str(a.new_tokens), "--seed", str(seed)],
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    sys.exit(f"{impl} spg {spg} failed:\n{out.stderr[-3000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                results.setdefault((impl, spg), []).append(r)
                print(f"  {impl} spg {spg}: {r['s_per_step']:.2f} s/step", file=sys.stderr, flush=True)
    load = os.getloadavg()
    print(f"GRPO, SmolLM2-135M-Instruct fp32, {a.batch} completions/step ({a.num_generations} per prompt), "
          f"{a.new_tokens} new tokens, {a.steps} steps, {a.repeats} repeats (median), CPU "
          f"{os.cpu_count()} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}, "
          f"load average {load[0]:.2f} {load[1]:.2f}")
    print("CPU s/step: process CPU seconds per optimizer step (one thread; robust to a shared machine's load),")
    print("split into generation / scoring / training; wall s/step as measured (load-dependent)")
    print(f"{'impl':14} {'spg':>3} {'CPU s/step':>10} {'gen':>7} {'score':>7} {'train':>7} {'vs trl':>7} "
          f"{'wall s/step':>11} {'vs trl':>7} {'RSS MB':>7}")
    keys = ("cpu_per_step", "s_per_step", "generation", "scoring", "training")
    for (impl, spg), runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in keys}
        trl = {k: statistics.median(r[k] for r in results[("trl", spg)]) for k in keys} if ("trl", spg) in results \
            else {k: float("nan") for k in keys}
        print(f"{impl:14} {spg:>3} {med['cpu_per_step']:10.2f} {med['generation']:7.2f} {med['scoring']:7.2f} "
              f"{med['training']:7.2f} {trl['cpu_per_step'] / med['cpu_per_step']:6.2f}x {med['s_per_step']:11.2f} "
              f"{trl['s_per_step'] / med['s_per_step']:6.2f}x {max(r['peak_rss_mb'] for r in runs):7.0f}")
    print("mean reward per step (one row per run: impl, spg, seed order as run)")
    for (impl, spg), runs in results.items():
        for r in runs:
            print(f"  {impl:10} spg {spg}: " + " ".join(f"{x:.3f}" for x in r["rewards"]))


if __name__ == "__main__":
    main()
