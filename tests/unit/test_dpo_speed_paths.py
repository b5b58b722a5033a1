"""DPO's speed paths (conf/speed/) equal the plain path (TRL's layout, logits at every position), in float32:
`completion_only_logits` (the head applied only where a completion token is scored, in chunks),
`dpo_pair_rows` (one row `[prompt | chosen | rejected]` per pair, with a 4-D mask and position ids) and
`padding_free` (the rows' real tokens packed into one row, attention per row on the padded layout).

Rows have different prompt and completion lengths, so every batch is padded in both layouts.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from datasets import Dataset
from transformers import Qwen2Config, Qwen2ForCausalLM

from ablate.losses.logps import per_sequence, sequence_logps, token_logps
from ablate.methods.dpo import DPOTrainer
from ablate.models import tiny
from ablate.models.adapters import lora, with_adapters
from ablate.speed.head import completion_logps
from ablate.speed.packing import packed_inputs, takes_packed, use_packed_attention
from ablate.speed.pairs import plain_pairs, plain_targets, shared_prompt_pairs
from ablate.speed.plan import SpeedSwitches
from ablate.speed.split import lm_parts, takes_custom_mask
from tiny_setups import dpo_config, moved

ROWS = [
    {"prompt": "sort: cba =", "chosen": " abc", "rejected": " bac"},
    {"prompt": "sort: hgfedcba =", "chosen": " abcdefgh", "rejected": " hg"},
    {"prompt": "s:", "chosen": " cd", "rejected": " dcxyzwvu"},
    {"prompt": "sort: zyxw =", "chosen": " wxyz", "rejected": " zyxw"},
    {"prompt": "sort: edc =", "chosen": " cde", "rejected": " ced"},
    {"prompt": "sort: qpon =", "chosen": " nopq", "rejected": " qnpo"},
]
METRICS = (
    "loss",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "entropy",
    "logits/chosen",
    "logits/rejected",
    "mean_token_accuracy",
    "num_tokens",
)


def _rows(tok):
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    return [
        {
            "prompt_ids": ids(r["prompt"]),
            "chosen_ids": ids(r["chosen"]) + [tok.eos_token_id],
            "rejected_ids": ids(r["rejected"]) + [tok.eos_token_id],
        }
        for r in ROWS
    ]


def test_shared_prompt_layout_positions_and_mask():
    """Pair (prompt [5, 6], chosen [7, 2], rejected [8, 2]): row 5 6 7 2 8 2, positions 0 1 2 3 2 3;
    rejected (row positions 4, 5) sees the prompt (0, 1) and itself, never chosen (2, 3).
    Chosen 7 is predicted at 1, chosen 2 at 2; rejected 8 at 1 (the prompt's end), rejected 2 at 4."""
    b = shared_prompt_pairs(
        [
            {"prompt_ids": [5, 6], "chosen_ids": [7, 2], "rejected_ids": [8, 2]},
            {"prompt_ids": [5], "chosen_ids": [2], "rejected_ids": [9, 2]},
        ],
        pad_token_id=0,
    )
    assert b["input_ids"].tolist() == [[5, 6, 7, 2, 8, 2], [5, 2, 9, 2, 0, 0]]
    assert b["position_ids"][0].tolist() == [0, 1, 2, 3, 2, 3]
    assert b["position_ids"][1, :4].tolist() == [0, 1, 1, 2]
    m = b["attention_mask"][0, 0].int().tolist()
    assert m[4] == [1, 1, 0, 0, 1, 0] and m[5] == [1, 1, 0, 0, 1, 1] and m[3] == [1, 1, 1, 1, 0, 0]
    assert b["attention_mask"][1, 0, 5].int().tolist() == [0, 0, 0, 0, 0, 1]  # padding sees itself only
    # row 1 (width 6): chosen 2 at 0, rejected 9 at 0 (prompt end), rejected 2 at 2
    assert b["src"].tolist() == [1, 2, 1, 4, 6, 6, 8]
    assert b["tgt"].tolist() == [7, 2, 8, 2, 2, 9, 2]
    assert b["seq"].tolist() == [0, 0, 2, 2, 1, 3, 3]


def _qwen2():
    config = Qwen2Config(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "llama_lora"])
@pytest.mark.parametrize(
    "chunk_elements", [1 << 24, 300 * 5]
)  # one chunk; chunks of 5 rows (recomputed in backward)
def test_completion_logps_equal_full_logits(arch, chunk_elements):
    """Per-sequence log-probs and every gradient equal the plain path's (full logits, token_logps)."""
    tok, llama = tiny()
    model = moved(_qwen2() if arch == "qwen2" else llama)
    if arch == "llama_lora":
        model = with_adapters(model, lora(r=4, lora_alpha=8, lora_dropout=0.0))
    batch = plain_pairs(_rows(tok), tok.pad_token_id)
    ids, am, cm = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]

    def grads():
        out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        return out

    plain = sequence_logps(token_logps(model(input_ids=ids, attention_mask=am).logits, ids), cm[:, 1:])
    (plain * torch.arange(1.0, len(plain) + 1)).sum().backward()  # a different weight per sequence
    g_plain = grads()
    parts = lm_parts(model)
    assert parts is not None
    backbone, head = parts
    where = plain_targets(ids, cm)
    hidden = backbone(input_ids=ids, attention_mask=am).last_hidden_state
    token, stats = completion_logps(hidden.flatten(0, 1)[where["src"]], head, where["tgt"], chunk_elements)
    fast = per_sequence(token, where["seq"], len(plain))
    (fast * torch.arange(1.0, len(fast) + 1)).sum().backward()
    g_fast = grads()
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)
    assert g_fast.keys() == g_plain.keys() and g_plain
    for name in g_plain:  # atol scales with the largest gradient: the tied embedding's (~300) sums many
        # terms, so float32 rounding (a different order of sums, e.g. through the lean norms) is ~1e-7 of it
        atol = 1e-6 * max(10.0, g_plain[name].abs().max().item())
        torch.testing.assert_close(g_fast[name], g_plain[name], rtol=1e-5, atol=atol, msg=name)
    assert stats["entropy"].shape == token.shape and not stats["entropy"].requires_grad


def test_no_split_for_a_lora_head_or_unknown_models():
    tok, model = tiny()
    assert lm_parts(model) is not None and takes_custom_mask(model)
    on_head = with_adapters(copy.deepcopy(model), lora(r=4, target_modules=["lm_head", "q_proj"]))
    assert lm_parts(on_head) is None  # peft's lora.Linear around the head: the model's own forward
    model.config.model_type = "somethingelse"
    assert lm_parts(model) is None and not takes_custom_mask(model)


def _train(tmp_path, name, steps=3, attn="sdpa", lean_layers=True, **speed):
    tok, model = tiny()
    model = moved(model)
    model.set_attn_implementation(attn)
    args = dpo_config(tmp_path / name, bf16=False, max_steps=steps)
    trainer = DPOTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(ROWS),
        processing_class=tok,
        perf=SpeedSwitches(lean_layers=lean_layers, **speed),
    )
    trainer.train()
    return [e for e in trainer.state.log_history if "loss" in e]


@pytest.mark.parametrize(
    "speed,attn",
    [
        (
            {"dpo_pair_rows": True, "completion_only_logits": True, "padding_free": True},
            "sdpa",
        ),  # the default
        ({"dpo_pair_rows": True, "completion_only_logits": True, "padding_free": False}, "sdpa"),
        ({"dpo_pair_rows": True, "completion_only_logits": False, "padding_free": False}, "sdpa"),
        ({"dpo_pair_rows": False, "completion_only_logits": True, "padding_free": False}, "sdpa"),
        ({"dpo_pair_rows": False, "completion_only_logits": False, "padding_free": True}, "sdpa"),
        (
            {"dpo_pair_rows": True, "completion_only_logits": True, "padding_free": True},
            "eager",
        ),  # packing: sdpa only
        # long rows (ablate.speed.packing.rows_mask): attention one causal row per completion, no mask
        ({"dpo_pair_rows": True, "completion_only_logits": True, "padding_free": True, "long": True}, "sdpa"),
        (
            {"dpo_pair_rows": False, "completion_only_logits": True, "padding_free": True, "long": True},
            "sdpa",
        ),
    ],
)
def test_speed_paths_equal_plain_path_step_by_step(tmp_path, monkeypatch, speed, attn):
    """Three optimizer steps (two batches of 3 pairs, then the first again on moved weights), with a
    precomputed reference: every logged loss and metric equals the plain path's to 1e-5. `long`: every
    row counts as long, so packed rows attend causally without a mask (one row per completion)."""
    from ablate.speed import packing

    speed = dict(speed)
    masks: list = []
    if speed.pop("long", False):
        monkeypatch.setattr(packing, "EAGER_MAX_SCORES", 0)
        sdpa = packing.sdpa_attention_forward
        monkeypatch.setattr(
            packing,
            "sdpa_attention_forward",
            lambda m, q, k, v, mask, *a, **kw: masks.append(mask) or sdpa(m, q, k, v, mask, *a, **kw),
        )
    plain = _train(
        tmp_path, "plain", attn=attn, dpo_pair_rows=False, completion_only_logits=False, padding_free=False
    )
    fast = _train(tmp_path, "fast", attn=attn, **speed)
    assert len(plain) == len(fast) == 3
    for a, b in zip(fast, plain):
        for name in METRICS:
            assert abs(a[name] - b[name]) <= 1e-5 * max(1.0, abs(b[name])), (
                a["step"],
                name,
                a[name],
                b[name],
            )
    assert plain[0]["loss"] != plain[2]["loss"]
    if masks:  # the packed rows' attention ran causally, with no mask (the plain path packs nothing)
        assert any(m is None for m in masks)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "llama_lora"])
@pytest.mark.parametrize("layout", ["plain", "shared"])
def test_packed_forward_equals_padded(arch, layout):
    """The packed row's hidden states at every real token, and every gradient, equal the padded
    batch's; only the real tokens (sum of row lengths, no padding) pass through the projections."""
    tok, llama = tiny()
    model = moved(_qwen2() if arch == "qwen2" else llama)
    if arch == "llama_lora":
        model = with_adapters(model, lora(r=4, lora_alpha=8, lora_dropout=0.0))
    rows = _rows(tok)
    if layout == "plain":
        b = plain_pairs(rows, tok.pad_token_id)
        inputs, lengths = (
            {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]},
            b["attention_mask"].sum(-1),
        )
        src = plain_targets(b["input_ids"], b["completion_mask"])["src"]
    else:
        b = shared_prompt_pairs(rows, tok.pad_token_id)
        inputs = {k: b[k] for k in ("input_ids", "position_ids", "attention_mask")}
        lengths, src = b["lengths"], b["src"]
    assert lengths.sum() < inputs["input_ids"].numel()  # the batch pads
    backbone, _ = lm_parts(model)
    weight = torch.randn(len(src), backbone.config.hidden_size, generator=torch.Generator().manual_seed(2))

    def run(**kw):
        hidden = backbone(**kw).last_hidden_state.flatten(0, 1)
        return hidden, {n: g for n, g in zip(*_grads(model, (hidden[kw.pop("_src")] * weight).sum()))}

    padded_hidden, padded_grads = run(**inputs, _src=src)
    assert use_packed_attention(model) and takes_packed(model)
    packed, packed_src = packed_inputs(inputs, src, lengths)
    seen = []
    hook = backbone.layers[0].self_attn.q_proj.register_forward_hook(
        lambda m, i, o: seen.append(i[0].shape[:-1])
    )
    hidden, grads = run(**packed, _src=packed_src)
    hook.remove()
    assert seen == [torch.Size([1, int(lengths.sum())])]
    torch.testing.assert_close(hidden[packed_src], padded_hidden[src], rtol=1e-5, atol=1e-5)
    assert grads.keys() == padded_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], padded_grads[name], rtol=1e-5, atol=1e-5, msg=name)
    # the model still runs unpacked batches as sdpa does (generation, eval logits, a 2-D mask)
    out = backbone(
        input_ids=b["input_ids"][:2], attention_mask=torch.ones_like(b["input_ids"][:2])
    ).last_hidden_state
    model.set_attn_implementation(
        "sdpa"
    ) if arch != "llama_lora" else model.get_base_model().set_attn_implementation("sdpa")
    ref = backbone(
        input_ids=b["input_ids"][:2], attention_mask=torch.ones_like(b["input_ids"][:2])
    ).last_hidden_state
    torch.testing.assert_close(out, ref)


def _grads(model, loss):
    model.zero_grad()
    loss.backward()
    named = [(n, p.grad.clone()) for n, p in model.named_parameters() if p.grad is not None]
    return [n for n, _ in named], [g for _, g in named]


def test_packing_skips_eager_and_unknown_models():
    tok, model = tiny()
    model.set_attn_implementation("eager")
    assert not use_packed_attention(model) and not takes_packed(model)
    _, other = tiny()
    other.config.model_type = "somethingelse"
    assert not use_packed_attention(other) and other.config._attn_implementation == "sdpa"


def test_dpo_steps_equal_with_and_without_lean_layers(tmp_path):
    """Three optimizer steps (default speed paths, the moved weights feed back into steps 2 and 3) with
    `speed.lean_layers` on and off (ablate.speed.lean): every logged loss and metric equal to 1e-5."""
    plain, lean = _train(tmp_path, "plain", lean_layers=False), _train(tmp_path, "lean", lean_layers=True)
    assert len(plain) == len(lean) == 3
    for a, b in zip(lean, plain):
        for name in METRICS:
            assert abs(a[name] - b[name]) <= 1e-5 * max(1.0, abs(b[name])), (
                a["step"],
                name,
                a[name],
                b[name],
            )
    assert plain[0]["loss"] != plain[2]["loss"]


def test_takes_eager_only_for_small_reduced_precision_cpu_attention():
    """CPU + bf16/fp16 (as q's dtype or autocast's) + a boolean mask + at most EAGER_MAX_SCORES scores."""
    from ablate.speed.packing import EAGER_MAX_SCORES, takes_eager

    mask = torch.ones(2, 1, 8, 8, dtype=torch.bool)
    q = torch.zeros(2, 4, 8, 16)
    assert not takes_eager(q, mask)  # float32: sdpa, so every float32 number is unchanged
    assert takes_eager(q.bfloat16(), mask) and takes_eager(q.half(), mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # q arrives in float32 (rotary upcasts it)
        assert takes_eager(q, mask)
    assert not takes_eager(q.bfloat16(), None) and not takes_eager(q.bfloat16(), mask.float())
    width = int(math.isqrt(EAGER_MAX_SCORES // 8)) + 1  # rows * heads * width^2 just above the limit
    assert not takes_eager(torch.zeros(2, 4, width, 1, dtype=torch.bfloat16), mask)
    assert takes_eager(torch.zeros(2, 4, width - 1, 1, dtype=torch.bfloat16), mask)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_packed_bf16_autocast_runs_eager_with_sdpa_precision(arch, monkeypatch):
    """Under bf16 autocast on CPU the packed batch's attention is transformers' eager attention (2-3x
    faster than sdpa's flash kernel at these sizes, ablate.speed.packing.EAGER_MAX_SCORES): it runs in
    every layer, and its hidden states and gradients are as close to the float32 padded forward's as
    the padded bf16 sdpa forward's are (twice that error at most: the same precision class)."""
    from ablate.speed import packing

    calls = []
    eager = packing.eager_attention_forward
    monkeypatch.setattr(packing, "eager_attention_forward", lambda *a, **k: calls.append(1) or eager(*a, **k))
    tok, llama = tiny()
    model = moved(_qwen2() if arch == "qwen2" else llama)
    b = shared_prompt_pairs(_rows(tok), tok.pad_token_id)
    inputs = {k: b[k] for k in ("input_ids", "position_ids", "attention_mask")}
    backbone, _ = lm_parts(model)
    weight = torch.randn(
        len(b["src"]), backbone.config.hidden_size, generator=torch.Generator().manual_seed(2)
    )

    def run(src, bf16, **kw):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            hidden = backbone(**kw).last_hidden_state.flatten(0, 1)[src].float()
        names, grads = _grads(model, (hidden * weight).sum())
        return hidden, torch.cat([g.flatten() for g in grads])

    ref = run(b["src"], False, **inputs)  # float32, padded, sdpa
    sdpa = run(b["src"], True, **inputs)  # bf16, padded, sdpa
    assert not calls
    use_packed_attention(model)
    packed, packed_src = packed_inputs(inputs, b["src"], b["lengths"])
    fast = run(packed_src, True, **packed)
    assert len(calls) == backbone.config.num_hidden_layers
    for got, want, bf16 in zip(fast, ref, sdpa):
        err, bf16_err = (got - want).abs().max(), (bf16 - want).abs().max()
        assert 0 < err <= 2 * bf16_err, (err, bf16_err)
    calls.clear()
    assert torch.equal(run(packed_src, False, **packed)[0], run(packed_src, False, **packed)[0]) and not calls
