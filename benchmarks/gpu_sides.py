"""The child side of benchmarks/gpu.py: one process per side (TRL, or ablate's variants one after another)
and section; shapes, data, the tokenizer and the model built on the device, the same in every process.

    python benchmarks/gpu_sides.py '{"kind": "dpo", "side": "ablate", ...}'   # (gpu.py runs these)

Prints one JSON line: {variant: harness.report's fields + gpu_peak_mb, the speed plan it ran} (or
{variant: {"error": ...}} where one could not run: a missing kernel is a line in the table, not a crash).
"""

from __future__ import annotations

import gc
import json
import os
import random
import sys
from typing import Any

import harness  # benchmarks/harness.py (the script's dir is on sys.path)
import sides  # benchmarks/sides.py

SHAPES = {  # hidden, layers, heads, kv heads, intermediate, vocab
    "0.5b": (1536, 16, 12, 4, 4096, 49152),
    "1.5b": (2048, 24, 16, 4, 8192, 49152),
    "exact": (256, 4, 4, 2, 1024, 49152),
    "tiny": (64, 2, 4, 2, 128, 2048),
}
# ---- the child side: one process per side and section ----


def wide_tokenizer(vocab: int) -> Any:
    """ablate's byte tokenizer (text -> one token a byte, no download) with `vocab` ids: the extra ids are
    byte pairs no text encodes to but every sampled id decodes from (GRPO's rewards read the text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from ablate.models.tokenizer import BOS, CHAT_TEMPLATE, EOS, PAD, byte_tokenizer

    ids = dict(byte_tokenizer().get_vocab())
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    pairs = (a + b for a in alphabet for b in alphabet)
    while len(ids) < vocab:
        ids.setdefault(next(pairs), len(ids))
    tok = Tokenizer(models.BPE(vocab=ids, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, model_max_length=4096
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build(shape: str, device: str, seed: int = 0) -> tuple[Any, Any]:
    """(tokenizer, a Llama of `shape` initialised from `seed` on `device`): the same weights in every process."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, kv, inter, vocab = SHAPES[shape]
    tok = wide_tokenizer(vocab)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=inter,
        max_position_embeddings=4096,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    return tok, model


def text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(max(1, n)))


def pairs(n: int, side: int, seed: int = 0) -> list[dict[str, str]]:
    """`n` preference rows, each side ~`side` tokens (byte tokenizer): prompt ~side/2, completions ~side/2,
    lengths varying +-25% so batches pad."""
    rng = random.Random(seed)
    vary = lambda k: int(k * rng.uniform(0.75, 1.25))  # noqa: E731
    return [
        {
            "prompt": text(rng, vary(side // 2)),
            "chosen": text(rng, vary(side // 2)),
            "rejected": text(rng, vary(side // 2)),
        }
        for _ in range(n)
    ]


def perf_of(spec: Any) -> Any:
    from ablate.speed.plan import SpeedSwitches

    if spec == "off":
        return SpeedSwitches.off()
    if isinstance(spec, str):  # one path alone, forced onto the device
        return SpeedSwitches(
            **{
                **{k: False for k in SpeedSwitches.__dataclass_fields__},
                spec: True,
                "unverified_devices": True,
            }
        )
    return SpeedSwitches(**spec)


class GPURecorder(harness.StepRecorder):
    """StepRecorder that waits for the device before each step's clock reading (kernels run asynchronously)."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        super().on_step_end(args, state, control, **kwargs)


def _memory_start(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _memory_peak(device: str) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None


def run_side(cfg: dict[str, Any]) -> dict[str, Any]:
    """One side of a timed section: TRL, or ablate's variants one after another (each a fresh model from
    the same seed; GPU peak memory reset between them). Prints one JSON line."""
    variants = {"trl": None} if cfg["side"] == "trl" else cfg["variants"]
    out: dict[str, Any] = {}
    for name, spec in variants.items():
        _memory_start(cfg["device"])
        try:
            out[name] = SECTIONS[cfg["kind"]](cfg, spec)
        except Exception as e:  # noqa: BLE001 - one failed variant (a missing kernel, ...) is a line in the table
            out[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
        gc.collect()
    print(json.dumps(out), flush=True)
    return out


def _args(cfg: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return sides.trainer_args(
        f"/tmp/ablate-gpu-bench/{cfg['kind']}-{os.getpid()}",
        cfg["steps"],
        bf16=cfg["bf16"],
        use_cpu=cfg["device"] == "cpu",
        gradient_checkpointing=False,
        **kw,
    )


def _trainer(method: str, spec: Any, rec: Any, common: dict[str, Any], **kw: Any) -> Any:
    """TRL's trainer (`spec` None; its fused head's rows counted) or ablate's with the speed paths `spec`."""
    if spec is None:
        rec.watch_trl_fused_head()
        return sides.trainer(method, "trl", args=common, callbacks=[rec], **kw)
    common.pop("gradient_checkpointing")
    return sides.trainer(method, "ablate", args=common, callbacks=[rec], perf=perf_of(spec), **kw)


def _finish(cfg: dict[str, Any], rec: Any, model: Any, trainer: Any, **extra: Any) -> dict[str, Any]:
    seq = cfg.get("seq_len", 0)
    from ablate.speed import throughput

    result = harness.report(rec, model, trainer.args, gpu_peak_mb=_memory_peak(cfg["device"]), **extra)
    result["flops_per_token"] = throughput.flops_per_token(model, seq_len=seq)  # with attention's term
    return result


def dpo_side(cfg: dict[str, Any], spec: Any) -> dict[str, Any]:
    from datasets import Dataset

    tok, model = build(cfg["shape"], cfg["device"])
    train = Dataset.from_list(pairs(cfg["batch"] * cfg["steps"], cfg["side_tokens"]))
    common = _args(
        cfg,
        per_device_train_batch_size=cfg["batch"],
        beta=0.1,
        precompute_ref_log_probs=True,
        max_length=2 * cfg["side_tokens"],
        include_num_input_tokens_seen="non_padding",
    )
    rec = GPURecorder()
    rec.watch(model)
    trainer = _trainer("dpo", spec, rec, common, model=model, tok=tok, train=train)
    trainer.train()
    return _finish(cfg, rec, model, trainer, plan=_plan_of(trainer))


def sft_side(cfg: dict[str, Any], spec: Any) -> dict[str, Any]:
    from datasets import Dataset

    tok, model = build(cfg["shape"], cfg["device"])
    rows = [
        {"prompt": r["prompt"], "completion": r["chosen"]}
        for r in pairs(cfg["batch"] * cfg["steps"], cfg["side_tokens"])
    ]
    common = _args(
        cfg,
        per_device_train_batch_size=cfg["batch"],
        max_length=2 * cfg["side_tokens"],
        include_num_input_tokens_seen="non_padding",
    )
    rec = GPURecorder()
    rec.watch(model)
    trainer = _trainer("sft", spec, rec, common, model=model, tok=tok, train=Dataset.from_list(rows))
    trainer.train()
    return _finish(cfg, rec, model, trainer, plan=_plan_of(trainer))


def reward_even(completions: list, **_: Any) -> list[float]:
    """GRPO's reward: the share of characters with an even code point. Every sampled id decodes to text
    (wide_tokenizer), so every completion scores somewhere around 0.5 and the completions of a group differ:
    advantages and gradients are never zero, and the per-step reward and gradient norm compare the sides."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ord(ch) % 2 == 0 for ch in t) / max(len(t), 1) for t in texts]


def grpo_side(cfg: dict[str, Any], spec: Any) -> dict[str, Any]:
    from datasets import Dataset

    from grpo_vs_trl import _seeded, _timed, completion_tokens, round_means

    tok, model = build(cfg["shape"], cfg["device"])
    rng = random.Random(0)
    prompts = Dataset.from_dict({"prompt": [text(rng, cfg["prompt_tokens"]) for _ in range(64)]})
    common = _args(
        cfg,
        per_device_train_batch_size=cfg["batch"],
        num_generations=cfg["generations"],
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        max_completion_length=cfg["new_tokens"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
    )
    box = {"generation": 0.0, "round": 0.0, "generation_cpu": 0.0, "round_cpu": 0.0, "generated_tokens": 0}
    rec = GPURecorder()
    rec.watch(model)
    trainer = _trainer("grpo", spec, rec, common, model=model, tok=tok, train=prompts, rewards=(reward_even,))
    if spec is None:
        _seeded(trainer, "_generate_single_turn", 1000)
        _timed(trainer, "_generate_single_turn", box, "generation", lambda out: completion_tokens(out[0]))
    else:
        gen = trainer.generator
        trainer.generator = lambda m, p: gen(m, p)
        _seeded(trainer, "generator", 1000)
        _timed(trainer, "generator", box, "generation", completion_tokens)
    trainer.train()
    steps = max(len(rec.step_seconds), 1)
    rec.step_seconds = round_means(rec.step_seconds, 1)
    return _finish(
        cfg,
        rec,
        model,
        trainer,
        generated_tokens=int(box["generated_tokens"]),
        generation_s=box["generation"] / steps,
        plan=_plan_of(trainer),
    )


def _plan_of(trainer: Any) -> dict[str, bool] | None:
    plan = getattr(trainer, "speed_plan", None)
    return {d.name: d.on for d in plan.decisions} if plan is not None else None


SECTIONS = {"dpo": dpo_side, "sft": sft_side, "grpo": grpo_side}


if __name__ == "__main__":
    cfg = json.loads(sys.argv[1])
    if cfg["kind"] == "exact":
        from gpu_exact import exact

        print(json.dumps(exact(cfg)), flush=True)
    else:
        run_side(cfg)
