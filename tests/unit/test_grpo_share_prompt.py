"""GRPO's shared-prompt scoring equals the row-per-completion path (`speed.grpo_group_rows=false`, TRL's layout):
one row `[prompt | c_1 | ... | c_k]` per prompt group (ablate.speed.groups), packed into one row of real
tokens, the head applied only at completion positions, at the sampling temperature. Per-token log-probs,
entropies and every gradient to 1e-5 in float32 (tiny Llama, tiny Qwen2 with GQA, Llama + LoRA), and
optimizer steps with equal losses and metrics (spg 1; spg 2 with num_iterations 2: old log-probs; beta >
0: the reference model)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import Qwen2Config, Qwen2ForCausalLM

from ablate.methods.grpo import GRPOConfig, GRPOTrainer
from ablate.models import tiny
from ablate.models.adapters import lora, with_adapters
from ablate.rollouts.generation import left_pad
from ablate.speed import packing, scoring
from ablate.speed.groups import prompt_groups, shared_prompt_groups
from ablate.speed.plan import SpeedSwitches
from tiny_setups import moved, three_groups, three_groups_trainer


def test_shared_prompt_groups_layout():
    """Rows 0, 1 share prompt [5, 6] (row 1 left-padded once more: the same real tokens), row 2 has
    prompt [7]. Completions [8, 9], [3], [4, pad] (mask 1 0). Group 0: 5 6 8 9 3, positions 0 1 2 3 2;
    group 1: 7 4, positions 0 1. Token 3 (row 1) sits at 4, sees the prompt (0, 1) and itself only,
    and is predicted by the prompt's end (1), as 8 is; 9 is predicted at 2; 4 (row 2) at 5 + 0 = 5.

    Packed, the tokens are 5 6 8 9 3 7 4 (0..6); attention runs on one row per completion, width 2 + 2,
    real tokens first: row 0 = 5 6 8 9 (flat 0-3: tokens 0-3), row 1 = 5 6 3 _ (flat 4-6: tokens 0, 1, 4),
    row 2 = 7 4 _ _ (flat 8, 9: tokens 5, 6); the prompt [5, 6] takes its output from row 0."""
    p_ids = torch.tensor([[0, 5, 6], [0, 5, 6], [0, 0, 7]])
    p_mask = torch.tensor([[0, 1, 1], [0, 1, 1], [0, 0, 1]])
    c_ids = torch.tensor([[8, 9], [3, 0], [4, 1]])
    c_mask = torch.tensor([[1, 1], [1, 0], [1, 0]])
    assert prompt_groups(p_ids, p_mask) == [[0, 1], [2]]
    b = shared_prompt_groups(p_ids, p_mask, c_ids, c_mask, pad_token_id=0)
    assert b["input_ids"].tolist() == [[5, 6, 8, 9, 3], [7, 4, 0, 0, 0]]
    assert b["position_ids"][0].tolist() == [0, 1, 2, 3, 2] and b["position_ids"][1, :2].tolist() == [0, 1]
    assert b["lengths"].tolist() == [5, 2]
    m = b["attention_mask"][0, 0].int().tolist()
    assert m[4] == [1, 1, 0, 0, 1] and m[3] == [1, 1, 1, 1, 0] and m[1] == [1, 1, 0, 0, 0]
    assert b["attention_mask"][1, 0, 4].int().tolist() == [0, 0, 0, 0, 1]  # padding sees itself only
    assert b["src"].tolist() == [1, 2, 1, 5]
    assert b["tgt"].tolist() == [8, 9, 3, 4]
    assert b["row"].tolist() == [0, 0, 1, 2] and b["col"].tolist() == [0, 1, 0, 0]
    assert sorted(zip(b["row_index"].tolist(), b["row_source"].tolist())) == [
        (0, 0),
        (1, 1),
        (2, 2),
        (3, 3),
        (4, 0),
        (5, 1),
        (6, 4),
        (8, 5),
        (9, 6),
    ]
    assert b["row_out"].tolist() == [0, 1, 2, 3, 6, 8, 9]
    assert b["row_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]  # right padding only


def test_groups_are_runs_of_equal_prompts_of_any_size():
    p_ids, p_mask = left_pad([[1], [1], [1], [2, 3], [1]], 0)
    assert prompt_groups(p_ids, p_mask) == [[0, 1, 2], [3], [4]]


def _model(arch: str) -> tuple[Any, Any]:
    tok, model = tiny()
    if arch == "qwen2":  # grouped-query attention
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=len(tok),
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                tie_word_embeddings=False,
            )
        )
    model = moved(model)
    if arch == "llama_eager":
        model.set_attn_implementation("eager")
    if arch.startswith("llama_lora"):  # llama_lora_head: a LoRA head, so the model's own forward scores
        targets = ["q_proj", "v_proj", "lm_head"] if arch == "llama_lora_head" else ["q_proj", "v_proj"]
        model = with_adapters(model, lora(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets))
    return tok, model


def _batch(tok: Any) -> dict[str, torch.Tensor]:
    """3 groups of 3 (prompts of 4, 12 and 1 tokens: left padding), completions of 1 to 5 tokens
    (right padding), one fully masked (a truncated completion under mask_truncated_completions)."""
    batch = three_groups(tok)
    batch["completion_mask"][5] = 0
    return batch


@pytest.mark.parametrize(
    "arch", ["llama", "qwen2", "llama_lora", "llama_eager", "llama_lora_head", "llama_long", "qwen2_long"]
)
def test_shared_prompt_logps_equal_row_per_completion(tmp_path, monkeypatch, arch):
    """Log-probs and entropies at every completion token, and every gradient, equal the plain path's
    (one left-padded row per completion, full logits: group rows and length groups off), fp32 1e-5;
    masked positions are 0. The shared path runs, packed (sdpa) with one projection row of real tokens.
    `_long`: rows as long rows run them (ablate.speed.packing.rows_mask: no mask, sdpa's causal kernel)."""
    long = arch.endswith("_long")
    arch = arch.removesuffix("_long")
    if long:
        monkeypatch.setattr(packing, "EAGER_MAX_SCORES", 0)  # every row "long"
    tok, model = _model(arch)
    trainer = three_groups_trainer(tmp_path, tok, model)
    batch = _batch(tok)
    mask = batch["completion_mask"]
    weight = torch.randn(
        mask.shape, generator=torch.Generator().manual_seed(3)
    )  # a different weight per token

    def run() -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        logps, entropy = trainer._token_logps(model, batch, with_entropy=True)
        (logps * mask * weight).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return logps.detach(), entropy, grads

    calls: list[int] = []
    shapes: list[tuple[int, ...]] = []
    attention: list[int] = []
    shared = scoring.shared_prompt_logps
    monkeypatch.setattr(scoring, "shared_prompt_logps", lambda *a, **k: calls.append(1) or shared(*a, **k))
    sdpa = packing.sdpa_attention_forward
    monkeypatch.setattr(
        packing,
        "sdpa_attention_forward",  # the rows attention runs on
        lambda m, q, k_, v, mask, *a, **kw: (
            attention.append((q.shape[0], mask is None)) or sdpa(m, q, k_, v, mask, *a, **kw)
        ),
    )
    layer = model.get_base_model() if arch.startswith("llama_lora") else model
    hook = layer.model.layers[0].mlp.register_forward_hook(
        lambda m, i, o: shapes.append(tuple(i[0].shape[:-1]))
    )
    fast = run()
    hook.remove()
    shared_attention = list(attention)  # the plain path's calls come after
    trainer.speed_plan = trainer.speed_plan.turned_off("grpo_group_rows", "length_groups")
    plain = run()
    assert calls, "the shared-prompt path was not taken"
    real = int(batch["prompt_mask"][::3].sum() + mask.sum())  # each prompt once, real completion tokens only
    if arch == "llama_eager":  # not packed: one row per prompt, a 4-D mask
        assert shapes == [(3, shapes[0][1])] and not shared_attention
    else:  # packed: each prompt once through the projections, attention one row per completion
        assert shapes == [(1, real)] and shared_attention == [(9, long), (9, long)]
    torch.testing.assert_close(fast[0] * mask, plain[0] * mask, rtol=0, atol=1e-5)
    torch.testing.assert_close(fast[1] * mask, plain[1] * mask, rtol=0, atol=1e-5)
    assert (fast[0][mask == 0] == 0).all() and (fast[1][mask == 0] == 0).all()
    assert fast[2].keys() == plain[2].keys() and fast[2]
    for name in plain[2]:
        torch.testing.assert_close(fast[2][name], plain[2][name], rtol=1e-4, atol=1e-5, msg=name)


def test_falls_back_to_rows_for_other_models(tmp_path, monkeypatch):
    """A model outside ablate.speed.split's families (the plan turns grpo_group_rows off), or a batch with
    an empty prompt, is scored one row per completion."""
    calls: list[int] = []
    shared = scoring.shared_prompt_logps
    monkeypatch.setattr(scoring, "shared_prompt_logps", lambda *a, **k: calls.append(1) or shared(*a, **k))
    tok, model = tiny()
    model.config.model_type = "somethingelse"
    trainer = three_groups_trainer(tmp_path, tok, model)
    assert not trainer.speed_plan.on("grpo_group_rows") and trainer.perf.grpo_group_rows  # requested, off
    trainer._token_logps(model, _batch(tok))
    assert not calls
    tok, model = tiny()
    trainer = three_groups_trainer(tmp_path, tok, model)
    batch = _batch(tok)
    trainer._token_logps(model, batch)
    assert calls == [1] and trainer.speed_plan.on("grpo_group_rows")  # on by default
    batch["prompt_mask"][0] = 0
    with pytest.warns(UserWarning, match="empty prompt"):
        trainer._token_logps(model, batch)
    assert calls == [1]


def _train(tmp_path: Any, name: str, **kw: Any) -> list[dict[str, float]]:
    """4 optimizer steps of GRPO on the tiny model; 40 stop ids so completions end at different lengths."""
    tok, model = tiny()
    model = moved(model)
    model.generation_config.eos_token_id = list(range(60, 100))
    data = Dataset.from_dict({"prompt": ["abc:", "hello there:", "x", "sort: zyx ="]})
    group_rows = kw.pop("group_rows")
    args = GRPOConfig(
        output_dir=str(tmp_path / name),
        per_device_train_batch_size=6,
        num_generations=3,
        max_completion_length=6,
        temperature=0.9,
        max_steps=4,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        use_cpu=True,
        **kw,
    )
    trainer = GRPOTrainer(
        model=model,
        args=args,
        train_dataset=data,
        processing_class=tok,
        reward_funcs={"len": lambda completions, **_: [float(len(c)) for c in completions]},
        perf=SpeedSwitches(grpo_group_rows=group_rows),
    )
    trainer.train()
    return [e for e in trainer.state.log_history if "loss" in e]


@pytest.mark.parametrize(
    "kw",
    [
        {"steps_per_generation": 1, "mask_truncated_completions": True},  # rows without EOS fully masked
        {"steps_per_generation": 2, "num_iterations": 2},  # old log-probs scored at generation time
        {"steps_per_generation": 2, "num_iterations": 2, "beta": 0.1},  # and the reference model's
    ],
)
def test_training_steps_equal_row_per_completion(tmp_path, monkeypatch, kw):
    """Every logged loss and metric of 4 optimizer steps equals the row-per-completion path's to 1e-5."""
    calls = []
    shared = scoring.shared_prompt_logps
    monkeypatch.setattr(scoring, "shared_prompt_logps", lambda *a, **k: calls.append(1) or shared(*a, **k))
    fast = _train(tmp_path, "fast", group_rows=True, **kw)
    # every micro-step's loss, plus (one round) the old policy's and the reference's log-probs
    assert len(calls) == 4 + ("num_iterations" in kw) + ("beta" in kw)
    calls.clear()
    plain = _train(tmp_path, "plain", group_rows=False, **kw)
    assert len(fast) == len(plain) == 4
    for a, b in zip(fast, plain):
        assert a.keys() == b.keys()
        for name in a:
            if not name.startswith("timing/") and not name.endswith("_per_second"):  # wall clock
                assert abs(a[name] - b[name]) <= 1e-5 * max(1.0, abs(b[name])), (
                    a["step"],
                    name,
                    a[name],
                    b[name],
                )
    assert len({round(e["loss"], 6) for e in plain}) > 1 and not calls
    if "num_iterations" in kw:  # off-policy micro-steps: the ratio is not 1, clipping acts
        assert any(e["clip_ratio/region_mean"] > 0 for e in plain)
    if "beta" in kw:
        assert any(e["kl"] > 0 for e in plain)
