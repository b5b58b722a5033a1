"""Tool calls' token layout and loss equal TRL 1.16's GRPOTrainer(tools=...) on the same fixed rollouts.

Both trainers get the tiny model, the calculator tool and the same scripted generator (fixed completions, no
sampling): two prompts x two completions, one row answering with a correct call, one without a call, one calling
an unknown tool (an error the model reads, a failure), one calling correctly and answering wrong. Equal: the
prompt ids (the template offering the tool), every completion's ids (turns and tool results, TRL's layout), the
completion mask, the tool mask, the advantages (the reward reads the messages), the tool metrics, and, with an old
policy that differs (ratios != 1, clipping acts), the loss of every aggregation and each token's part in it
(d loss / d log-prob of that token, which is 0 on tool results)."""

from __future__ import annotations

import copy

import pytest
import torch
from datasets import Dataset

trl = pytest.importorskip("trl")

from ablate.methods.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from ablate.models import tiny  # noqa: E402
from ablate.rewards.calc import correct  # noqa: E402
from ablate.tools import calculator  # noqa: E402

CALL = '<tool_call>{"name": "%s", "arguments": {%s}}</tool_call>'
# per row: the first turn, and the turn after the tool result (None: the row calls no tool)
SCRIPT = [
    (CALL % ("calculator", '"expression": "12*34"'), "408"),
    ("400", None),
    (CALL % ("nope", ""), "4368"),
    (CALL % ("calculator", '"expression": "56*78"'), "4369"),
]
LOSSES = ("grpo", "dapo", "dr_grpo", "bnpo")


def scripted(tok):
    """(prompt ids) -> completion ids: a batch of all rows is turn 1 in row order; a later batch is recognised by
    the first turn its prompt holds."""

    def encode(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    def generate(prompt_ids: list[list[int]]) -> list[list[int]]:
        if len(prompt_ids) == len(SCRIPT):
            return [encode(first) for first, _ in SCRIPT]
        texts = [tok.decode(p) for p in prompt_ids]
        return [encode(next(then for first, then in SCRIPT if then and first in t)) for t in texts]

    return generate


def _rows() -> list[dict]:
    prompts = ["What is 12*34?", "What is 56*78?"]  # equal lengths: TRL scores without position ids
    return [{"prompt": [{"role": "user", "content": p}], "answer": str(eval(p[8:-1]))} for p in prompts]


def _leaf_logps(store: dict, fn):
    """Wrap a trainer's per-token log-prob function so the loss is taken from a leaf tensor we can differentiate by."""

    def wrapped(*args, **kwargs):
        logps, *rest = fn(*args, **kwargs)
        store["leaf"] = logps.detach().clone().requires_grad_()
        return (store["leaf"], *rest)

    return wrapped


@pytest.mark.parametrize("loss_type", LOSSES)
def test_tool_rollouts_match_trl(tmp_path, loss_type):
    tok, policy = tiny()
    ds = Dataset.from_list(_rows())
    common = dict(
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=160,
        report_to="none",
        use_cpu=True,
        bf16=False,
        epsilon=0.1,
        epsilon_high=0.15,
    )
    theirs = trl.GRPOTrainer(
        model=copy.deepcopy(policy),
        reward_funcs=[correct],
        train_dataset=ds,
        processing_class=tok,
        args=trl.GRPOConfig(output_dir=str(tmp_path / "trl"), loss_type=loss_type, **common),
        tools=[calculator],
    )
    generate = scripted(tok)
    theirs._generate_single_turn = lambda prompt_ids, *a, **k: (generate(prompt_ids), None)
    aggregation = getattr(__import__("ablate.losses.grpo", fromlist=[loss_type]), loss_type)
    ours = GRPOTrainer(
        model=copy.deepcopy(policy),
        reward_funcs={"correct": correct},
        train_dataset=ds,
        processing_class=tok,
        aggregation=aggregation,
        generator=lambda model, ids: generate(ids),
        args=GRPOConfig(output_dir=str(tmp_path / "ours"), tools=["ablate.tools.calculator"], **common),
    )
    theirs.model.train(), ours.model.train()
    rows = [ours.train_dataset[i] for i in (0, 0, 1, 1)]
    t = theirs._generate_and_score_completions([{k: r[k] for k in ("prompt", "answer")} for r in rows])
    o = ours._generate_and_score(rows, "train")
    for key, mine in (
        ("prompt_ids", o.prompt_ids),
        ("prompt_mask", o.prompt_mask),
        ("completion_ids", o.completion_ids),
        ("completion_mask", o.completion_mask),
        ("tool_mask", o.tool_mask),
    ):
        assert torch.equal(t[key], mine), key
    assert (o.tool_mask == 0).sum() > 0 and o.tool_mask[1].all()  # results in rows 0, 2, 3; none in row 1
    torch.testing.assert_close(t["advantages"], o.advantages)
    assert o.advantages.abs().sum() > 0
    m_theirs = {k: v[-1] for k, v in theirs._metrics["train"].items()}
    m_ours = ours.metrics.pop("train")
    for name in ("tools/call_frequency", "tools/failure_frequency", "completions/mean_length", "reward"):
        assert abs(float(m_ours[name]) - m_theirs[name]) <= 1e-6, (name, m_ours[name], m_theirs[name])
    assert m_theirs["tools/call_frequency"] == 0.75 and m_theirs["tools/failure_frequency"] == pytest.approx(
        1 / 3
    )

    # an older policy (ratios != 1): the same old log-probs to both, then the loss and each token's part in it
    with torch.no_grad():
        current = ours._token_logps(ours.model, o.tokens())[0]
    old = current + 0.2 * torch.randn(current.shape, generator=torch.Generator().manual_seed(0))
    t["old_per_token_logps"], o.old_logps = old, old
    grads = {}
    for name, trainer, attr in (
        ("theirs", theirs, "_get_per_token_logps_and_entropies"),
        ("ours", ours, "_token_logps"),
    ):
        store = grads.setdefault(name, {})
        setattr(trainer, attr, _leaf_logps(store, getattr(trainer, attr)))
    theirs.current_gradient_accumulation_steps = 1
    loss_theirs = theirs.compute_loss(theirs.model, t)
    loss_ours = ours.compute_loss(ours.model, o)
    assert abs(loss_ours.item() - loss_theirs.item()) <= 1e-6, (loss_ours.item(), loss_theirs.item())
    g_theirs = torch.autograd.grad(loss_theirs, grads["theirs"]["leaf"])[0]
    g_ours = torch.autograd.grad(loss_ours, grads["ours"]["leaf"])[0]
    torch.testing.assert_close(g_ours, g_theirs, rtol=0, atol=1e-7)
    assert (g_ours[o.tool_mask == 0] == 0).all() and (g_ours[o.loss_mask() == 1] != 0).any()
