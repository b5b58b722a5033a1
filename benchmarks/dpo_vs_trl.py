"""Side by side: ablate's DPOTrainer vs TRL's on the same model, data, optimizer and steps.

    python benchmarks/dpo_vs_trl.py [--steps 40] [--hidden 256] [--layers 4] [--repeats 3]

Each trainer runs in its own subprocess (so peak memory is its own), `--repeats` times, alternating;
benchmarks/harness.py prints the table (s/step, whole-process s, tokens/s, MFU, peak RSS, per-step loss
difference). Not part of the test run: numbers depend on the machine (the README records one set).
"""

from __future__ import annotations

import argparse
import sys

import harness  # benchmarks/harness.py (the script's dir is on sys.path)


def run_one(impl: str, steps: int, hidden: int, layers: int) -> dict:
    import torch

    from ablate.data import packaged
    from ablate.models import tiny

    torch.manual_seed(0)
    tok, model = tiny(hidden_size=hidden, num_layers=layers, intermediate_size=4 * hidden)
    train = packaged("sort_prefs", with_eval=False).train
    common = dict(output_dir=f"/tmp/bench-{impl}", per_device_train_batch_size=8, max_steps=steps,
                  logging_steps=1, report_to="none", save_strategy="no", beta=0.1, use_cpu=True,
                  bf16=False, precompute_ref_log_probs=True, learning_rate=1e-3, lr_scheduler_type="constant", seed=0, disable_tqdm=True,
                  include_num_input_tokens_seen="non_padding")
    rec = harness.StepRecorder()

    if impl == "trl":
        import trl

        import copy

        # TRL needs the reference object even to precompute (it would load it by name otherwise)
        trainer = trl.DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=trl.DPOConfig(**common),
                                 train_dataset=train,
                                 processing_class=tok, callbacks=[rec])
    else:
        from ablate.trainers.dpo import DPOConfig, DPOTrainer

        trainer = DPOTrainer(model=model, args=DPOConfig(**common), train_dataset=train,
                             processing_class=tok, callbacks=[rec])
    trainer.train()
    return harness.report(rec, model, trainer.args)  # one JSON line on stdout


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--child", choices=["ablate", "trl"])
    a = p.parse_args()
    if a.child:
        run_one(a.child, a.steps, a.hidden, a.layers)
        return
    load = harness.load_average()
    args = ["--steps", str(a.steps), "--hidden", str(a.hidden), "--layers", str(a.layers)]
    results = harness.run_alternately({impl: [sys.executable, __file__, "--child", impl, *args]
                                       for impl in ("ablate", "trl")}, a.repeats)
    harness.print_table(f"DPO, {a.steps} steps, batch 8 pairs, hidden {a.hidden}, {a.layers} layers, CPU, fp32",
                        results, load)


if __name__ == "__main__":
    main()
