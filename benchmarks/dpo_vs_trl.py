"""Side by side: ablate's DPOTrainer vs TRL's on the same model, data, optimizer and steps.

    python benchmarks/dpo_vs_trl.py [--steps 40] [--hidden 256] [--layers 4] [--repeats 3]

Each trainer runs in its own subprocess (so peak memory is its own), `--repeats` times; the script
prints median seconds per step, peak RSS, and the largest per-step loss difference. Not part of the
test run: numbers depend on the machine (the README records one set).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def run_one(impl: str, steps: int, hidden: int, layers: int) -> dict:
    import torch
    from transformers import TrainerCallback

    from ablate.data import packaged
    from ablate.models import tiny

    torch.manual_seed(0)
    tok, model = tiny(hidden_size=hidden, num_layers=layers, intermediate_size=4 * hidden)
    train = packaged("sort_prefs", with_eval=False).train
    common = dict(output_dir=f"/tmp/bench-{impl}", per_device_train_batch_size=8, max_steps=steps,
                  logging_steps=1, report_to="none", save_strategy="no", beta=0.1, use_cpu=True,
                  bf16=False, precompute_ref_log_probs=True, learning_rate=1e-3, lr_scheduler_type="constant", seed=0, disable_tqdm=True)
    losses: list[float] = []

    class Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    if impl == "trl":
        import trl

        import copy

        # TRL needs the reference object even to precompute (it would load it by name otherwise)
        trainer = trl.DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=trl.DPOConfig(**common),
                                 train_dataset=train,
                                 processing_class=tok, callbacks=[Record()])
    else:
        from ablate.trainers.dpo import DPOConfig, DPOTrainer

        trainer = DPOTrainer(model=model, args=DPOConfig(**common), train_dataset=train,
                             processing_class=tok, callbacks=[Record()])
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    return {"impl": impl, "seconds_per_step": seconds / steps, "losses": losses,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--child", choices=["ablate", "trl"])
    a = p.parse_args()
    if a.child:
        print(json.dumps(run_one(a.child, a.steps, a.hidden, a.layers)))
        return
    results: dict[str, list[dict]] = {"ablate": [], "trl": []}
    for _ in range(a.repeats):
        for impl in results:
            out = subprocess.run([sys.executable, __file__, "--child", impl, "--steps", str(a.steps),
                                  "--hidden", str(a.hidden), "--layers", str(a.layers)],
                                 capture_output=True, text=True, check=True)
            results[impl].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"DPO, {a.steps} steps, batch 8 pairs, hidden {a.hidden}, {a.layers} layers, CPU, {a.repeats} repeats")
    print(f"{'impl':8} {'s/step (median)':>16} {'peak RSS MB':>12}")
    for impl, runs in results.items():
        print(f"{impl:8} {statistics.median(r['seconds_per_step'] for r in runs):16.4f} "
              f"{max(r['peak_rss_mb'] for r in runs):12.0f}")
    diff = max(abs(x - y) for x, y in zip(results["ablate"][0]["losses"], results["trl"][0]["losses"]))
    print(f"max |loss_ablate - loss_trl| over {len(results['trl'][0]['losses'])} steps: {diff:.2e}")


if __name__ == "__main__":
    main()
