"""Side by side: ablate's GRPOTrainer vs TRL 1.16's on SmolLM2-135M-Instruct, same prompts and reward.

    python benchmarks/grpo_vs_trl.py [--steps 4] [--spg 1 4] [--batch 16] [--num-generations 8]
                                     [--new-tokens 64] [--repeats 2] [--seed 0] [--vary-seed]
                                     [--impls ablate trl ablate:hf ablate:noshare ablate:async1 ablate:async1:bf16
                                              ablate:async1:bf16:balanced]
                                     [--full-length]

Both trainers get the same model dir (`ablate fetch smollm2_135m`), the packaged `one_word_prompts`
data (chat prompts, reward 1 / word count), the same geometry (`--batch` completions per optimizer
step, `--num-generations` per prompt, `--new-tokens` new tokens, `--spg` steps per generation round),
fp32, temperature 0.8, top_k 0 (off, TRL's default), lr 3e-5, beta 0, DAPO aggregation.

On the shared harness (benchmarks/harness.py): each run is its own subprocess (peak RSS and start-up
are its own), the impls alternate (A B A B), `--repeats` times (`--vary-seed`: repeat r uses seed + r).
Per `--spg` value one harness table: median s/step (each step counted as its generation round's mean
seconds, so generation is in it whatever spg; each run's first step left out), whole-process s,
tokens/s (prompt + completion tokens trained on), MFU (6N per trained token + 2N per generated
completion token), HW MFU (what the training forwards with grad computed, counted by hooks on the
embedding and LM head, and on TRL's fused head, which on CPU projects every position of every row
(prompt and padding too) where ablate projects completion positions only: generation and old-policy
scoring run under no_grad in both trainers and are not counted; backward's recompute of checkpointed
or fused logits chunks is not counted either),
peak RSS, and max |dloss| against the FIRST impl's first run (same seed). With sampling, losses match
only where the completions do: `trl` draws its own samples, so its difference from `ablate` is no
correctness check (its completions and losses part after the first step); ablate sides with the same
sampler and seed must be ~0: `ablate` vs `ablate:noshare` (same completions, training scores one row per
completion instead of one per prompt), and `ablate:hf` where model.generate draws the same samples.
So put the side to compare against first (default: ablate).

A second table gives CPU seconds per step (the process's, one thread: what a loaded machine does not
inflate much), split into generation (the `generate` call), scoring (the rest of the generation round:
reward, old-policy log-probs when needed) and training (forward + backward + optimizer) by wrapping
each trainer's methods from outside, with "vs trl" ratios (trl CPU s / impl CPU s; wall s likewise).
Then the mean reward per step of every run (reward curves over seeds with `--vary-seed`).
`--impls ablate:hf` runs ablate with its plain `HFGenerator` (model.generate), `ablate:noshare` with
`speed.grpo_group_rows` off, `ablate:nolengths` with `speed.length_groups` off (`--record` adds these three and
writes each path's CPU verdict, ablate against the side without it, into this CPU family's measured.json record), `ablate:asyncN` asynchronous GRPO with `max_staleness=N` (a forked generation
worker samples round k+N while round k trains: torch's threads split between the two, so run it with
OMP_NUM_THREADS=2 on 2 cores, where the synchronous sides use both threads for each phase);
`ablate:asyncN:bf16` the same with the worker in bf16 (`generation_dtype=bfloat16`), and a `:balanced` suffix
(`ablate:async1:balanced`, `ablate:async1:bf16:balanced`) with `async_threads=balanced` (the trainer takes
the worker's thread while the worker is idle). For an
async side the CPU split counts the worker's CPU as generation (its process's, once it has exited),
"wait" is the time training waited for a round, and its losses differ from the synchronous sides'
(samples from older weights, other seeds). `--full-length` (ablate sides) ends no completion early: on
this task the reward is for short answers, so a side that learns them later (async: stale samples)
generates longer completions and pays for them per step; with every completion --new-tokens long, a
step's generation work is the same on both sides and s/step compares the schedules. Not part of the test run: numbers depend on the machine
(docs/benchmarks.md records one set).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from typing import Any, Callable

import harness  # benchmarks/harness.py (the script's dir is on sys.path)
import sides  # benchmarks/sides.py


def _timed(
    obj: Any, name: str, box: dict[str, float], key: str, generated: Callable[[Any], int] | None = None
) -> None:
    """Wrap obj.name so its wall time accumulates in box[key], its CPU time in box[key + "_cpu"], and
    (with `generated`: the result -> its completions' token count) box["generated_tokens"]."""
    fn = getattr(obj, name)

    def wrapper(*a: Any, **kw: Any) -> Any:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            out = fn(*a, **kw)
        finally:
            box[key] += time.perf_counter() - t0
            box[key + "_cpu"] += time.process_time() - c0
        if generated is not None:
            box["generated_tokens"] += generated(out)
        return out

    setattr(obj, name, wrapper)


def _seeded(obj: Any, name: str, seed: int) -> None:
    """Wrap obj.name (a generation call) so round k samples from torch's RNG seeded with seed + k: what each
    trainer draws from the global RNG between rounds (TRL shuffles its generation batch with torch.randperm)
    no longer moves the samples, and two trainers that generate alike draw the same completions every round."""
    fn, rounds = getattr(obj, name), [0]

    def wrapper(*a: Any, **kw: Any) -> Any:
        import torch

        torch.manual_seed(seed + rounds[0])
        rounds[0] += 1
        return fn(*a, **kw)

    setattr(obj, name, wrapper)


def completion_tokens(completion_ids: list[list[int]]) -> int:
    """Tokens sampled (each EOS included, no padding): what MFU counts 2N FLOPs for."""
    return sum(len(ids) for ids in completion_ids)


def round_means(step_seconds: list[float], spg: int) -> list[float]:
    """Each step's seconds replaced by its generation round's mean (rounds: spg consecutive steps, the
    first of which generates). The harness's median over steps would otherwise pick a training-only step
    when spg > 1 and leave generation out of s/step (and MFU, which counts it, over 100%)."""
    return [statistics.fmean(step_seconds[i - i % spg : i - i % spg + spg]) for i in range(len(step_seconds))]


def run_one(
    impl: str, steps: int, batch: int, g: int, spg: int, new_tokens: int, seed: int, full_length: bool = False
) -> dict:
    import torch

    if full_length:  # no id ends a completion: every one is new_tokens long, whatever the policy has learned
        if impl == "trl":
            raise SystemExit("--full-length is for ablate's sides only")
        import ablate.methods.grpo
        import ablate.rollouts.generation

        ablate.rollouts.generation.stop_ids = ablate.methods.grpo.stop_ids = lambda tokenizer, model=None: [
            -1
        ]

    from ablate.data import packaged
    from ablate.models import smollm2_135m
    from ablate.rewards.format import one_word

    torch.manual_seed(seed)
    tok, model = smollm2_135m()  # transformers' own RMSNorm and MLP: ablate's speed plan makes them lean
    train = packaged("one_word_prompts", with_eval=False).train
    common = sides.trainer_args(
        f"/tmp/bench-grpo-{impl}-{os.getpid()}",
        steps,
        per_device_train_batch_size=batch,
        num_generations=g,
        steps_per_generation=spg,
        gradient_accumulation_steps=1,
        max_completion_length=new_tokens,
        temperature=0.8,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        learning_rate=3e-5,
        use_cpu=True,
        bf16=False,
        seed=seed,
    )
    box = {"generation": 0.0, "round": 0.0, "generation_cpu": 0.0, "round_cpu": 0.0, "generated_tokens": 0}
    # per-step seconds, losses, rewards, gradient norms, tokens (num_input_tokens_seen: both count it)
    rec = harness.StepRecorder()
    rec.watch(model)  # HW MFU: only forwards with grad (training), not generation or no-grad scoring
    if impl == "trl":
        rec.watch_trl_fused_head()  # TRL projects through lm_head.weight, not the head module
        trainer = sides.trainer(
            "grpo",
            "trl",
            model=model,
            tok=tok,
            train=train,
            args=common,
            callbacks=[rec],
            rewards=(one_word,),
        )
        # returns (completion_ids, logprobs), the ids without padding after the first EOS
        _timed(trainer, "_generate_single_turn", box, "generation", lambda out: completion_tokens(out[0]))
        _timed(trainer, "_generate_and_score_completions", box, "round")
    else:
        from ablate.methods.grpo import GRPOConfig, GRPOTrainer
        from ablate.rollouts.generation import HFGenerator
        from ablate.speed.plan import SpeedSwitches

        args = GRPOConfig(
            **common,
            max_staleness=staleness(impl),
            generation_dtype="bfloat16" if ":bf16" in impl else None,
            async_threads="balanced" if impl.endswith(":balanced") else "split",
        )
        kw: dict[str, Any] = {"generator": HFGenerator(args, tok)} if impl == "ablate:hf" else {}
        trainer = GRPOTrainer(
            model=model,
            args=args,
            train_dataset=train,
            processing_class=tok,
            reward_funcs={"one_word": one_word},
            callbacks=[rec],
            perf=SpeedSwitches(
                grpo_group_rows=impl != "ablate:noshare", length_groups=impl != "ablate:nolengths"
            ),
            **kw,
        )
        if staleness(impl):  # generation runs in the worker process: the trainer's side is taking the round
            _timed(trainer, "_take_ahead", box, "round")
        else:
            gen: Callable = trainer.generator
            trainer.generator = lambda m, p: gen(m, p)  # an instance attribute _timed can wrap
            _timed(trainer, "generator", box, "generation", completion_tokens)
            _timed(trainer, "_generate_and_score", box, "round")
    t0, c0, children0 = time.perf_counter(), time.process_time(), _children_cpu()
    trainer.train()
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    extra: dict[str, Any] = {}
    if staleness(impl):  # the worker has exited (train() closes it): its CPU is the children's
        worker = _children_cpu() - children0
        stats = trainer.rollout_stats()
        box["generation_cpu"], box["generated_tokens"] = worker, stats.generated_tokens
        box["round_cpu"] += worker
        cpu += worker
        extra = {
            "wait": stats.generation_seconds / steps,
            "worker_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        }
    raw_step_seconds, rec.step_seconds = rec.step_seconds, round_means(rec.step_seconds, spg)
    return harness.report(
        rec,
        model,
        trainer.args,
        generated_tokens=int(box["generated_tokens"]),
        impl=impl,
        spg=spg,
        seed=seed,
        wall_per_step=total / steps,
        cpu_per_step=cpu / steps,
        raw_step_seconds=raw_step_seconds,
        generation=box["generation_cpu"] / steps,
        scoring=(box["round_cpu"] - box["generation_cpu"]) / steps,
        training=(cpu - box["round_cpu"]) / steps,
        **extra,
    )


# --record: each path's two sides (without it, with it): one switch apart, the same samples
RECORDED = {
    "grpo_group_rows": ("ablate:noshare", "ablate"),
    "shared_prefill": ("ablate:hf", "ablate"),
    "length_groups": ("ablate:nolengths", "ablate"),
}


def staleness(impl: str) -> int:
    """`ablate:asyncN[:bf16][:balanced]` -> N (asynchronous GRPO's max_staleness); 0 for the synchronous sides."""
    return int(impl.removeprefix("ablate:async").split(":")[0]) if impl.startswith("ablate:async") else 0


def _children_cpu() -> float:
    """CPU seconds of this process's exited (waited-for) children: the async generation worker."""
    t = os.times()
    return t.children_user + t.children_system


def cpu_table(results: dict[str, list[dict]], spg: int) -> str:
    """CPU seconds per step split into generation / scoring / training, with "vs trl" ratios (trl's
    seconds / the impl's: above 1x the impl is faster), wall seconds per step (whole train()), peak RSS."""
    keys = ("cpu_per_step", "wall_per_step", "generation", "scoring", "training")
    med = {impl: {k: statistics.median(r[k] for r in runs) for k in keys} for impl, runs in results.items()}
    trl = med.get("trl", {k: float("nan") for k in keys})
    for impl, runs in results.items():  # the harness's s/step: median step after each run's first
        med[impl]["steady"] = statistics.median(
            x for r in runs for x in (r["step_seconds"][1:] or r["step_seconds"])
        )
    base = next(iter(med.values()))
    lines = [
        f"{'impl':14} {'spg':>3} {'CPU s/step':>10} {'gen':>7} {'score':>7} {'train':>7} {'vs trl':>7} "
        f"{'wall s/step':>11} {'vs trl':>7} {'vs first':>8} {'wait':>6} {'RSS MB':>7}"
    ]
    for impl, m in med.items():
        waits = [r["wait"] for r in results[impl] if "wait" in r]
        rss = max(r["peak_rss_mb"] + r.get("worker_rss_mb", 0.0) for r in results[impl])  # + the worker's
        lines.append(
            f"{impl:14} {spg:>3} {m['cpu_per_step']:10.2f} {m['generation']:7.2f} {m['scoring']:7.2f} "
            f"{m['training']:7.2f} {trl['cpu_per_step'] / m['cpu_per_step']:6.2f}x "
            f"{m['wall_per_step']:11.2f} {trl['wall_per_step'] / m['wall_per_step']:6.2f}x "
            f"{base['steady'] / m['steady']:7.2f}x "
            f"{statistics.median(waits) if waits else float('nan'):6.2f} {rss:7.0f}"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--spg", type=int, nargs="+", default=[1, 4])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--vary-seed", action="store_true", help="repeat r runs seed + r (reward curves over seeds)"
    )
    p.add_argument(
        "--impls",
        nargs="+",
        default=["ablate", "trl"],
        help="alternated; the first is the base max |dloss| is measured against",
    )
    p.add_argument(
        "--full-length",
        action="store_true",
        help="ablate sides: no stop id, every completion --new-tokens long (a step's generation work fixed, "
        "so a side that learns the short answers later is not charged for its longer ones)",
    )
    p.add_argument(
        "--record",
        nargs="?",
        const="",
        metavar="MEASURED_JSON",
        help="write each GRPO path's CPU speedup and exactness (the sides in RECORDED, at the first "
        "--spg) into this CPU family's record of ablate's measured.json (or of the file given)",
    )
    p.add_argument("--child", help="internal: run one impl and print its JSON")
    a = p.parse_args()
    if a.record is not None and not a.child:
        a.impls += [
            side
            for side in dict.fromkeys(s for pair in RECORDED.values() for s in pair)
            if side not in a.impls
        ]
    if a.child:
        run_one(a.child, a.steps, a.batch, a.num_generations, a.spg[0], a.new_tokens, a.seed, a.full_length)
        return
    print(
        f"GRPO, SmolLM2-135M-Instruct fp32, {a.batch} completions/step ({a.num_generations} per prompt), "
        f"{a.new_tokens} new tokens{' (all of them: --full-length)' if a.full_length else ''}, {a.steps} steps, "
        f"{a.repeats} repeats (median)"
    )
    recorded = None
    for spg in a.spg:
        load = harness.load_average()
        results: dict[str, list[dict]] = {impl: [] for impl in a.impls}
        for rep in range(a.repeats):  # one alternated round per repeat: its seed can differ (--vary-seed)
            seed = a.seed + rep if a.vary_seed else a.seed
            args = [
                "--steps",
                str(a.steps),
                "--spg",
                str(spg),
                "--batch",
                str(a.batch),
                "--num-generations",
                str(a.num_generations),
                "--new-tokens",
                str(a.new_tokens),
                "--seed",
                str(seed),
                *(["--full-length"] if a.full_length else []),
            ]
            round_ = harness.run_alternately(
                {impl: [sys.executable, __file__, "--child", impl, *args] for impl in a.impls}, repeats=1
            )
            for impl, runs in round_.items():
                results[impl] += runs
                steal = "" if runs[0]["steal"] is None else f" (CPU steal {runs[0]['steal']:.0%})"
                print(
                    f"  {impl} spg {spg} seed {seed}: {runs[0]['wall_per_step']:.2f} s/step{steal}",
                    file=sys.stderr,
                    flush=True,
                )
        print()
        harness.print_table(
            f"GRPO spg {spg}: max |dloss| vs {a.impls[0]} (seed {a.seed}"
            f"{', first repeat' if a.vary_seed else ''}); only comparable between sides "
            "with the same sampler (different samplers: different completions, different losses)",
            results,
            load,
        )
        print(
            "CPU s/step: process CPU seconds per optimizer step (one thread; robust to a shared machine's load),"
        )
        print(
            "split into generation / scoring / training; wall s/step: whole train() / steps (load-dependent);"
        )
        print(
            "vs first: the first impl's s/step over this one's (the table above: steady steps, generation included);"
        )
        print("wait: seconds per step an async side's training waited for its rounds")
        print(cpu_table(results, spg))
        print("mean reward per step (one row per run: impl, seed, in the order run)")
        for impl, runs in results.items():
            for r in runs:
                print(f"  {impl:14} seed {r['seed']}: " + " ".join(f"{x:.3f}" for x in r["rewards"]))
        recorded = recorded or results
    if a.record is not None and recorded:
        print(
            harness.record_cpu(
                recorded,
                RECORDED,
                lambda runs: statistics.median(r["cpu_per_step"] for r in runs),
                f"GRPO SmolLM2 fp32 {a.batch} x {a.new_tokens} tokens, spg {a.spg[0]}",
                a.record or None,
            )
        )


if __name__ == "__main__":
    main()
