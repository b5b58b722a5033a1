"""A real pretrained chat model end to end on CPU: SmolLM2-135M-Instruct, as a user runs it.

Each test runs `ablate train +experiment=smollm2_<method>` from a scratch directory with the default
run dir (outputs/runs/...), then reads the run's metrics.jsonl. The shipped data (`make_chat.py`) asks
"... Answer in ALL CAPS."; the instruct model knows the answers but writes them in sentence case, so
each method has something real to learn. About 10 minutes on 2 CPU cores for the whole file; the
model is fetched once (`ablate fetch smollm2_135m`) and skipped with its one-line reason when offline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import ablate, metrics, summary
from datasets import Dataset

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from ablate.errors import ConfigError
    from ablate.models.smollm2 import fetch

    try:
        return fetch()
    except ConfigError as e:  # offline and never fetched
        pytest.skip(str(e))


def _train(cwd: Path, *overrides: str) -> tuple[Path, list[dict[str, Any]]]:
    # the timeout is a hang guard: a run takes ~2 min on 2 quiet cores, but 20+ on a shared, loaded one
    proc = ablate("train", *overrides, "method.args.disable_tqdm=true", cwd=cwd, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (cwd / "outputs" / "runs").glob("*/*")
    assert summary(run_dir)["status"] == "completed"
    return run_dir, metrics(run_dir)


def _evals(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in rows if key in r]


@pytest.mark.parametrize("method", ["dpo", "dpo_hinge"])
def test_dpo_learns_a_held_out_preference(smollm2, tmp_path, method):
    """On 32 held-out pairs (questions not in the train split): eval accuracy starts at 0 (before any
    update the implicit rewards of chosen and rejected are both exactly 0: a tie is not a win) and ends
    >= 0.9, where a preference the model had not learned would sit near 0.5. The model's own
    preference flips: it starts out giving the sentence-case answer the higher log-prob and ends up
    giving the capitals the higher one."""
    _, rows = _train(tmp_path, "+experiment=smollm2_dpo", f"method={method}")
    acc = _evals(rows, "eval_rewards/accuracies")
    margins = _evals(rows, "eval_rewards/margins")
    chosen, rejected = _evals(rows, "eval_logps/chosen"), _evals(rows, "eval_logps/rejected")
    assert acc[0][0] == 0 and acc[-1][0] == 12, acc  # an eval before training and one at the end
    assert acc[0][1] == 0.0 and acc[-1][1] >= 0.9, acc
    assert margins[-1][1] > margins[0][1] + 1.0, margins
    assert chosen[0][1] < rejected[0][1] and chosen[-1][1] > rejected[-1][1], (chosen, rejected)


def test_sft_with_chat_template_lowers_held_out_loss(smollm2, tmp_path):
    """Eval loss on 32 held-out conversations (completion tokens only, chat template applied) falls
    to under half its value before training."""
    _, rows = _train(tmp_path, "+experiment=smollm2_sft")
    loss = _evals(rows, "eval_loss")
    assert loss[0][0] == 0 and len(loss) >= 2, loss
    assert loss[-1][1] < 0.5 * loss[0][1], loss


def test_sft_on_messages_trains_only_assistant_turns(smollm2, tmp_path):
    """data=caps_messages (two-turn `messages` conversations) with assistant_only_loss: the tokens in the
    loss are exactly the assistant turns' content and <|im_end|>, in `ablate data preview` and in the
    prepared dataset (the system prompt, user turns and role headers are not), and eval loss on 32
    held-out conversations falls to under half its value before training."""
    import re

    from transformers import AutoTokenizer

    from ablate.data.tokenize import prepare_sft

    preview = ablate("data", "preview", "+experiment=smollm2_sft_messages", "-n", "2", cwd=tmp_path)
    assert preview.returncode == 0, preview.stderr[-3000:]
    examples = preview.stdout.split("===== example ")[1:]
    rows = [
        json.loads(line)
        for line in (Path(__file__).parents[2] / "src/ablate/data/tiny/caps_messages_train.jsonl")
        .read_text()
        .splitlines()
    ]
    for example, row in zip(examples, rows):
        turns = [m["content"] + "<|im_end|>" for m in row["messages"] if m["role"] == "assistant"]
        assert re.findall(r"⟦(.*?)⟧", example, re.S) == turns, example
        assert "<|im_start|>system\nYou are a helpful AI assistant" in example  # shown, not marked
    tok = AutoTokenizer.from_pretrained(smollm2)
    prepared = prepare_sft(Dataset.from_list(rows), tok, 256, assistant_only_loss=True)
    assert len(prepared) == len(rows)  # nothing dropped
    for p, row in zip(prepared, rows):
        kept = tok.decode([t for t, m in zip(p["completion_ids"], p["completion_mask"]) if m])
        assert kept == "".join(
            m["content"] + "<|im_end|>" for m in row["messages"] if m["role"] == "assistant"
        )

    _, logged = _train(tmp_path, "+experiment=smollm2_sft_messages")
    loss = _evals(logged, "eval_loss")
    assert loss[0][0] == 0 and len(loss) >= 2, loss
    assert loss[-1][1] < 0.5 * loss[0][1], loss


def test_grpo_raises_the_reward_and_decodes_chat_completions(smollm2, tmp_path):
    """ "... Answer with one word.": the mean one_word reward (1 / words) of the last two logged rounds
    (steps 9-12) beats that of the first (steps 1-2) by >= 0.3; the completions end at the template's
    end-of-turn token (<|im_end|>), which decoding drops, and read as text."""
    run_dir, rows = _train(tmp_path, "+experiment=smollm2_grpo")
    reward = _evals(rows, "rewards/one_word/mean")
    assert [s for s, _ in reward] == [2, 4, 6, 8, 10, 12], reward
    assert (reward[-1][1] + reward[-2][1]) / 2 >= reward[0][1] + 0.3, reward
    ended = [1 - r["completions/clipped_ratio"] for r in rows if "completions/clipped_ratio" in r]
    assert ended[-1] >= 0.9, ended  # the answers stop at <|im_end|>, not at the length limit

    # the trained model, as saved, through the same generator GRPO samples with
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ablate.data import packaged
    from ablate.data.tokenize import encode_prompt
    from ablate.methods.grpo import GRPOConfig
    from ablate.rollouts.generation import HFGenerator

    tok = AutoTokenizer.from_pretrained(run_dir / "model")
    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token_id == im_end == model.generation_config.eos_token_id
    args = GRPOConfig(
        output_dir=str(tmp_path / "gen"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=32,
        temperature=0.7,
        report_to="none",
        use_cpu=True,
    )
    prompts = [row["prompt"] for row in packaged("one_word_prompts").eval.select(range(8))]
    torch.manual_seed(0)
    out = HFGenerator(args, tok)(model, [encode_prompt(tok, p) for p in prompts])
    ended = [ids for ids in out if ids and ids[-1] == im_end]
    assert len(ended) >= 6, [tok.decode(ids) for ids in out]
    for ids in ended:
        assert im_end not in ids[:-1]  # cut at the first end-of-turn
        text = tok.decode(ids, skip_special_tokens=True)
        assert text.strip() and "<|" not in text and "\ufffd" not in text, text  # no special or broken tokens
    print(json.dumps([tok.decode(ids, skip_special_tokens=True) for ids in out], indent=1))
