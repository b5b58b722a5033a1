"""Per-step DPO parity with TRL 1.16 on SmolLM2: BPE tokenizer, special tokens, chat template.

The byte tokenizer of the tiny model never merges tokens across the prompt/completion boundary and
has no chat template; SmolLM2's does both. A conversational JSONL file (read by `data=jsonl`, the
user's path) is trained for a few steps by TRL's `DPOTrainer` and by ablate's, from the same weights,
same seed, same optimizer; the per-step losses and the tokenised batches must agree.

The default suite uses SmolLM2's tokenizer with a small random Llama of SmolLM2's shape (seconds);
the slow test uses the real 135M model (`model=smollm2_135m`, fetched once). TRL is a dev-only
dependency, skipped when absent.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback

trl = pytest.importorskip("trl")

from ablate.data import jsonl  # noqa: E402
from ablate.losses import dpo as dpo_losses  # noqa: E402
from ablate.methods.dpo import DPOConfig, DPOTrainer  # noqa: E402
from ablate.models.smollm2 import fetch  # noqa: E402


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _bot(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


ROWS = [
    # the template injects its default system prompt
    {
        "prompt": _user("What is 5 plus 9? Answer in ALL CAPS."),
        "chosen": _bot("5 PLUS 9 IS 14."),
        "rejected": _bot("5 plus 9 is 14."),
    },
    # chosen starts with newlines: "\n" ending the generation prompt merges with them ("\n\n\n" is one
    # BPE token), so the completion starts one token early, inside what the prompt alone tokenises to
    {"prompt": _user("Write a haiku."), "chosen": _bot("\n\nSnow on the pine tree"), "rejected": _bot("No.")},
    # own system prompt, multi-turn history, special-token text inside a message
    {
        "prompt": [
            {"role": "system", "content": "Be brief."},
            *_user("Hi"),
            *_bot("Hello! <|im_end|> ok"),
            *_user("Capital of Peru?"),
        ],
        "chosen": _bot(" Lima."),
        "rejected": _bot("Lima, I think<|endoftext|>"),
    },
    # byte-level BPE on non-ASCII text
    {"prompt": _user("Say café in French."), "chosen": _bot("café ☕"), "rejected": _bot("coffee")},
]


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(fetch(quiet=True))


def _small_smollm2(tok) -> LlamaForCausalLM:
    """SmolLM2's architecture and vocabulary, shrunk: a few MB, random but fixed weights."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return LlamaForCausalLM(cfg)


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "chat_prefs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS * 2))  # 8 pairs: 4 steps of 2
    return path


def _run(tmp_path: Path, tok, model, loss_type: str, steps: int) -> None:
    train = jsonl(str(_file(tmp_path))).train
    common = dict(
        per_device_train_batch_size=2,
        max_steps=steps,
        logging_steps=1,
        learning_rate=1e-4,
        report_to="none",
        save_strategy="no",
        beta=0.1,
        max_length=128,
        precompute_ref_log_probs=True,
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
    )
    losses: dict[str, list[float]] = {"trl": [], "ours": []}

    def recorder(name: str) -> TrainerCallback:
        class Record(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kw):
                if logs and "loss" in logs:
                    losses[name].append(float(logs["loss"]))

        return Record()

    # TRL needs the reference object even to precompute (it would load it by name otherwise)
    theirs = trl.DPOTrainer(
        model=copy.deepcopy(model),
        ref_model=copy.deepcopy(model),
        args=trl.DPOConfig(output_dir=str(tmp_path / "trl"), loss_type=loss_type, **common),
        train_dataset=train,
        processing_class=tok,
        callbacks=[recorder("trl")],
    )
    ours = DPOTrainer(
        model=copy.deepcopy(model),
        args=DPOConfig(output_dir=str(tmp_path / "ours"), **common),
        loss=getattr(dpo_losses, loss_type),  # ablate's loss for TRL's loss_type
        train_dataset=train,
        processing_class=tok,
        callbacks=[recorder("ours")],
    )

    # the data exercises what the byte tokenizer could not: a merge across the boundary moves the
    # completion's start into the prompt's last token, and the template's end-of-turn ends each completion
    row = theirs.train_dataset[1]
    full_prompt = tok.apply_chat_template(
        ROWS[1]["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert len(row["prompt_ids"]) < len(full_prompt), (
        "row 1 no longer merges across the prompt/completion boundary"
    )
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert all(im_end in r["chosen_ids"] and im_end in r["rejected_ids"] for r in theirs.train_dataset)
    for key in ("prompt_ids", "chosen_ids", "rejected_ids"):  # ablate tokenises the file as TRL does
        assert ours.train_dataset[key] == theirs.train_dataset[key], key

    b_theirs, b_ours = next(iter(theirs.get_train_dataloader())), next(iter(ours.get_train_dataloader()))
    for key in ("input_ids", "attention_mask", "completion_mask"):
        assert torch.equal(b_theirs[key], b_ours[key]), key

    theirs.train()
    ours.train()
    assert len(losses["ours"]) == len(losses["trl"]) == steps
    assert len(set(losses["ours"])) > 1, "the loss never moved: the comparison would be vacuous"
    torch.testing.assert_close(
        torch.tensor(losses["ours"]), torch.tensor(losses["trl"]), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("loss_type", ["sigmoid", "hinge"])
def test_dpo_per_step_loss_matches_trl_on_smollm2_tokenizer(tmp_path, loss_type):
    tok = _tokenizer()
    _run(tmp_path, tok, _small_smollm2(tok), loss_type, steps=4)


@pytest.mark.slow
def test_dpo_per_step_loss_matches_trl_on_smollm2_135m(tmp_path):
    from ablate.models import smollm2_135m

    tok, model = smollm2_135m()
    _run(tmp_path, tok, model, "sigmoid", steps=3)
