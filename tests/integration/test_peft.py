"""`+peft=lora` / `+peft=qlora` end to end through the console entry point, from a scratch dir with
the default run dirs: DPO, SFT and GRPO train adapters only; `model/` holds the adapter and, with
`peft.save_merged=true`, a merged model whose weights are exactly base + (alpha / r) * B @ A (so the
base weights were not touched); a crashed LoRA run resumes to the same losses; QLoRA runs on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import ablate, metrics, summary
from safetensors.torch import load_file

ENV = {"OMP_NUM_THREADS": "1"}


def _train(cwd: Path, *overrides: str) -> Path:
    """Run `ablate train` in `cwd` with default dirs; return the one run dir it made."""
    cwd.mkdir(parents=True, exist_ok=True)
    r = ablate("train", *overrides, cwd=cwd, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = list((cwd / "outputs" / "runs").glob("*/*"))
    assert len(runs) == 1, runs
    assert summary(runs[0])["status"] == "completed"
    return runs[0]


def _losses(run_dir: Path, key: str = "loss") -> list[float]:
    return [e[key] for e in metrics(run_dir) if key in e]


def _check_adapter_dir(model_dir: Path) -> dict[str, torch.Tensor]:
    for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json"):
        assert (model_dir / name).is_file(), name
    assert not (model_dir / "model.safetensors").exists()  # the adapter only, not a copy of the base
    weights = load_file(model_dir / "adapter_model.safetensors")
    assert weights and all("lora_" in k for k in weights), list(weights)
    assert any(v.abs().max() > 0 for k, v in weights.items() if "lora_B" in k)  # B starts at 0: it trained
    return weights


def test_lora_dpo_trains_the_adapter_and_saves_it_merged(tmp_path):
    from transformers import AutoModelForCausalLM

    from ablate.models import tiny

    run = _train(
        tmp_path,
        "+peft=lora",
        "peft.save_merged=true",
        "method.args.max_steps=30",
        "method.args.logging_steps=5",
    )
    s = summary(run)
    assert s["metrics"]["rewards/margins"] > 0 and s["metrics"]["rewards/accuracies"] >= 0.75, s["metrics"]
    assert _losses(run)[-1] < _losses(run)[0]
    adapter = _check_adapter_dir(run / "model")
    # the run says how much trains (issue 37): the adapter's own parameter count, of the whole
    line = next(t for t in (run / "ablate.log").read_text().splitlines() if "LoRA (r=16, all-linear): " in t)
    trained = sum(v.numel() for v in adapter.values())
    assert f": {trained / 1e3:.3g}k of " in line and "parameters train (" in line, (line, trained)

    merged = AutoModelForCausalLM.from_pretrained(run / "model" / "merged")
    assert getattr(merged.config, "quantization_config", None) is None
    _, base = tiny()  # the weights the run started from
    scale = 32 / 16  # lora.yaml: lora_alpha / r
    merged_sd, base_sd = merged.state_dict(), base.state_dict()
    adapted = set()
    for key, a in adapter.items():
        if ".lora_A." not in key:
            continue
        module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
        b = adapter[key.replace("lora_A", "lora_B")]
        torch.testing.assert_close(merged_sd[f"{module}.weight"], base_sd[f"{module}.weight"] + scale * b @ a)
        adapted.add(f"{module}.weight")
    assert adapted and any("mlp" in k for k in adapted) and any("self_attn" in k for k in adapted)
    for key in base_sd.keys() - adapted:  # embeddings, norms: exactly the base
        assert torch.equal(merged_sd[key], base_sd[key]), key

    # the tiny model is built from code: its adapter has no base path to reload, and the error says so
    r = ablate(
        "train",
        "model=local",
        f"model.path='{run / 'model'}'",
        "method.args.max_steps=1",  # quoted: '=' in the name
        cwd=tmp_path,
        env=ENV,
    )
    assert r.returncode == 2 and "LoRA adapter" in r.stderr and "merged" in r.stderr, r.stderr[-2000:]


def test_lora_sft_then_dpo_from_the_adapter_dir(tmp_path):
    """SFT with LoRA on a saved model, then `model=local model.path=<sft run>/model` (the adapter dir):
    ablate loads the adapter's base and merges the adapter in, and DPO trains a new LoRA on top."""
    from transformers import AutoModelForCausalLM

    from ablate.models import pretrained, tiny

    tok, base = tiny()
    tok.save_pretrained(tmp_path / "base")
    base.save_pretrained(tmp_path / "base")
    sft = _train(
        tmp_path / "sft",
        "method=sft",
        "model=local",
        f"model.path={tmp_path / 'base'}",
        "+peft=lora",
        "peft.save_merged=true",
        "method.args.max_steps=30",
        "method.args.logging_steps=5",
    )
    losses = _losses(sft)
    assert losses[-1] < losses[0] - 0.3, losses  # a random tiny model: LoRA alone learns slowly
    _check_adapter_dir(sft / "model")

    _, from_adapter = pretrained(str(sft / "model"))  # the model=local code path on an adapter dir
    merged = AutoModelForCausalLM.from_pretrained(sft / "model" / "merged")
    ids = torch.tensor([tok("sort: cab =", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(from_adapter.eval()(ids).logits, merged.eval()(ids).logits)
        assert not torch.allclose(from_adapter(ids).logits, base.eval()(ids).logits)  # the SFT adapter is in

    dpo = _train(
        tmp_path / "dpo",
        "model=local",
        f"model.path='{sft / 'model'}'",
        "+peft=lora",
        "method.args.max_steps=3",
    )
    _check_adapter_dir(dpo / "model")


def test_lora_grpo_with_kl_to_the_base(tmp_path):
    """beta > 0: the KL reference is the model with adapters off, scored every generation round."""
    run = _train(
        tmp_path,
        "method=grpo",
        "+peft=lora",
        "method.args.beta=0.04",
        "method.args.max_steps=12",
        "method.args.logging_steps=3",
        "method.args.per_device_train_batch_size=32",
    )
    kls = _losses(run, "kl")
    assert kls and kls[0] >= 0 and max(kls) > 0, kls  # adapters move away from the base: KL > 0
    assert summary(run)["metrics"]["reward"] >= 0
    _check_adapter_dir(run / "model")


def test_lora_resume_reproduces_uninterrupted_losses(tmp_path):
    common = [
        "+peft=lora",
        "method.args.max_steps=8",
        "method.args.save_steps=3",
        "method.args.logging_steps=1",
        "+callbacks.crash._target_=crashing.CrashAt",
    ]
    a, b = tmp_path / "a", tmp_path / "b"
    assert ablate("train", *common, f"hydra.run.dir={a}", env=ENV).returncode == 0
    crashed = ablate("train", *common, f"hydra.run.dir={b}", env={**ENV, "ABLATE_TEST_CRASH_AT": "5"})
    assert crashed.returncode != 0 and summary(b)["status"] == "failed"
    assert (b / "checkpoints" / "checkpoint-3" / "adapter_model.safetensors").is_file()
    resumed = ablate("resume", str(b), env=ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert summary(b)["status"] == "completed" and summary(b)["global_step"] == 8
    la = [(e["step"], e["loss"]) for e in metrics(a) if "loss" in e]
    lb = [(e["step"], e["loss"]) for e in metrics(b) if "loss" in e]
    assert la == lb  # exact: the adapter, optimizer and RNG state come back from checkpoint-3
    assert (
        load_file(a / "model" / "adapter_model.safetensors").keys()
        == load_file(b / "model" / "adapter_model.safetensors").keys()
    )


def test_qlora_trains_on_cpu(tmp_path):
    """bitsandbytes >= 0.45 runs 4-bit layers on CPU: the tiny model is loaded in NF4, adapters train,
    and the merged model is saved in full precision (the base rebuilt unquantized)."""
    from transformers import AutoModelForCausalLM

    pytest.importorskip("bitsandbytes")
    run = _train(
        tmp_path,
        "+peft=qlora",
        "peft.save_merged=true",
        "method.args.max_steps=6",
        "method.args.logging_steps=2",
    )
    losses = _losses(run)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses
    _check_adapter_dir(run / "model")
    merged = AutoModelForCausalLM.from_pretrained(run / "model" / "merged")
    assert getattr(merged.config, "quantization_config", None) is None
    assert merged.dtype == torch.float32
