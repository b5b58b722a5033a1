"""The exact GRPO batch schedule: which prompts are generated in which round, which slice each
micro-step trains on, when pi_old is kept, resume with an empty buffer, and the on-policy gradient."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from ablate.errors import ConfigError
from ablate.losses.logps import selective_log_softmax
from ablate.methods.grpo import GRPOConfig, GRPOTrainer, RepeatSampler
from ablate.models import tiny
from ablate.rollouts.generation import HFGenerator, cut_at_eos, stop_ids
from ablate.rollouts.schedule import Schedule
from tiny_setups import grpo_config, numbered_prompts

N_PROMPTS = 16


class FakeGenerator:
    """Records the prompts of every generation round; completes prompt `pNN` with (NN % 3) + 1 'a's
    and EOS: deterministic, and lengths (the reward) differ between prompts."""

    def __init__(self, tok: Any) -> None:
        self.tok, self.rounds = tok, []

    def __call__(self, model: Any, prompt_ids: list[list[int]]) -> list[list[int]]:
        prompts = [self.tok.decode(p) for p in prompt_ids]
        self.rounds.append(prompts)
        return [
            self.tok("a" * (int(p[1:]) % 3 + 1), add_special_tokens=False)["input_ids"]
            + [self.tok.eos_token_id]
            for p in prompts
        ]


def off_policy_steps(spg: int, accumulation: int, num_iterations: int = 1) -> list[int]:
    """The schedule's off-policy optimizer steps (the batch and group sizes do not change them)."""
    return Schedule(
        batch_size=4,
        num_generations=2,
        steps_per_generation=spg,
        num_iterations=num_iterations,
        accumulation=accumulation,
    ).off_policy_steps()


def length_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    return [float(len(c)) for c in completions]


def _trainer(tmp_path: Path, generator: Any = None, **overrides: Any) -> tuple[GRPOTrainer, list[dict]]:
    """A GRPOTrainer on 16 distinct prompts p00..p15; records the prompts of each micro-step's slice."""
    tok, model = tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    kw = dict(steps_per_generation=4, max_steps=8, learning_rate=1e-3)
    trainer = GRPOTrainer(
        model=model,
        args=grpo_config(tmp_path, **(kw | overrides)),
        train_dataset=numbered_prompts(N_PROMPTS),
        processing_class=tok,
        reward_funcs={"length": length_reward},
        generator=generator or FakeGenerator(tok),
    )
    served: list[dict] = []
    compute_loss = trainer.compute_loss

    def recording(model: Any, inputs: dict, *a: Any, **k: Any) -> torch.Tensor:
        served.append(
            {
                "prompts": [tok.decode(p, skip_special_tokens=True) for p in inputs.prompt_ids],
                "old": inputs.old_logps is not None,
                "step": trainer.rollouts.micro_step,
            }
        )
        return compute_loss(model, inputs, *a, **k)

    trainer.compute_loss = recording
    return trainer, served


def test_repeat_sampler_order():
    """4 items, groups of 2, 2 prompts per chunk, each chunk repeated 3 times; seeded permutation."""
    s = RepeatSampler(list(range(4)), num_generations=2, prompts=2, repeat=3, seed=0)
    perm = torch.randperm(4, generator=torch.Generator().manual_seed(0)).tolist()
    a, b, c, d = perm
    assert list(s) == [a, a, b, b] * 3 + [c, c, d, d] * 3
    assert len(s) == 24
    s.set_epoch(1)  # a new epoch reshuffles, the same way in a resumed run
    again = RepeatSampler(list(range(4)), num_generations=2, prompts=2, repeat=3, seed=0)
    again.set_epoch(1)
    assert list(s) == list(again) != [a, a, b, b] * 3 + [c, c, d, d] * 3


def test_spg4_generates_four_steps_of_prompts_in_one_round(tmp_path):
    """spg=4, batch 4 completions (2 prompts x 2): round r holds the 8 prompts of micro-steps
    4r..4r+3, each twice in a row; micro-step k trains on slice k % 4 of its round's batch."""
    gen = FakeGenerator(tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)[0])
    trainer, served = _trainer(tmp_path, generator=gen)
    trainer.train()
    assert len(gen.rounds) == 2 and trainer.summary_fields()["generation_rounds"] == 2
    for r, prompts in enumerate(gen.rounds):
        assert len(prompts) == 16
        assert prompts[0::2] == prompts[1::2]  # each prompt's group kept together
        for k in range(4):
            assert served[4 * r + k]["prompts"] == prompts[4 * k : 4 * k + 4], (r, k)
    drawn = gen.rounds[0][0::2] + gen.rounds[1][0::2]
    assert len(set(drawn)) == 16  # no prompt re-drawn: an epoch of 16 prompts in 2 rounds
    assert all(s["old"] for s in served)  # spg 4 > accumulation 1: pi_old kept from generation time


def test_spg1_generates_every_step(tmp_path):
    trainer, served = _trainer(tmp_path, steps_per_generation=1)
    trainer.train()
    gen = trainer.generator
    assert len(gen.rounds) == 8 and trainer.rollout_stats().rounds == 8
    assert [s["prompts"] for s in served] == gen.rounds
    assert not any(s["old"] for s in served)  # on-policy: no extra forward for pi_old


@pytest.mark.parametrize(("spg", "ga", "old"), [(2, 2, False), (4, 2, True), (2, 3, True)])
def test_old_logps_only_when_policy_changes_between_generation_and_use(tmp_path, spg, ga, old):
    """spg 2 / accumulation 2: both slices feed one optimizer step -> no pi_old needed.
    spg 4 / accumulation 2, or spg 2 / accumulation 3 (a round straddles an update): pi_old kept."""
    trainer, served = _trainer(
        tmp_path, steps_per_generation=spg, gradient_accumulation_steps=ga, max_steps=2
    )
    trainer.train()
    assert {s["old"] for s in served} == {old}


@pytest.mark.parametrize("ckpt_step", [2, 10])
def test_resume_mid_round_serves_the_saved_round(tmp_path, ckpt_step):
    """Checkpoint mid-round (spg=4) in epoch 0 (step 2) or epoch 1 (step 10; 8 steps per epoch). A new
    trainer resumed from it loads the round's buffer from the checkpoint, serves its remaining slices
    without generating, then generates the next round: the same slices per step as the uninterrupted
    run (TRL crashed or misaligned here). Without the saved buffer it regenerates that round from the
    same prompts."""
    full, full_served = _trainer(tmp_path / "full", max_steps=12)
    full.train()
    first, _ = _trainer(tmp_path / "run", max_steps=ckpt_step, save_strategy="steps", save_steps=ckpt_step)
    first.train()
    ckpt = tmp_path / "run" / "out" / f"checkpoint-{ckpt_step}"
    assert ckpt.is_dir()
    resumed, served = _trainer(tmp_path / "run", max_steps=12)
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert [s["step"] for s in served] == list(range(ckpt_step, 12))
    assert resumed.generator.rounds == full.generator.rounds[ckpt_step // 4 + 1 :]  # the next rounds only
    assert [s["prompts"] for s in served] == [s["prompts"] for s in full_served[ckpt_step:]]
    (ckpt / "generation_buffer.pt").unlink()  # an older checkpoint: no buffer -> that round regenerated
    again, served = _trainer(tmp_path / "run", max_steps=12)
    again.train(resume_from_checkpoint=str(ckpt))
    assert again.generator.rounds == full.generator.rounds[ckpt_step // 4 :]
    assert [s["prompts"] for s in served] == [s["prompts"] for s in full_served[ckpt_step:]]


def test_resume_mid_round_reproduces_sampled_losses_exactly(tmp_path):
    """Real sampling (HFGenerator draws from the RNG): resumed at step 3 of a 4-step round, the per-step
    losses (constant lr: the first run stops at step 3, which would change a decaying schedule)
    equal the uninterrupted run's, because the round's completions and pi_old come from the
    checkpoint instead of being sampled again."""
    from ablate.rollouts.generation import HFGenerator

    def run(path: Path, **kw: Any) -> GRPOTrainer:
        tok = tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)[0]
        args = GRPOConfig(output_dir="/tmp/unused", max_completion_length=4, report_to="none")
        return _trainer(path, generator=HFGenerator(args, tok), lr_scheduler_type="constant", **kw)[0]

    full = run(tmp_path / "full")
    full.train()
    first = run(tmp_path / "run", max_steps=3, save_strategy="steps", save_steps=3)
    first.train()
    resumed = run(tmp_path / "run")
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "out" / "checkpoint-3"))
    losses = lambda t: {e["step"]: e["loss"] for e in t.state.log_history if "loss" in e}  # noqa: E731
    after = {k: v for k, v in losses(full).items() if k > 3}
    assert len(after) == 5 and {k: losses(resumed)[k] for k in after} == after
    assert resumed.rollout_stats().rounds == full.rollout_stats().rounds == 2


def test_batch_must_be_a_multiple_of_num_generations(tmp_path):
    with pytest.raises(
        ConfigError,
        match="per_device_train_batch_size=6: must be an integer >= 1 and a multiple of "
        "method.args.num_generations=4",
    ):
        GRPOConfig(
            output_dir=str(tmp_path), per_device_train_batch_size=6, num_generations=4, report_to="none"
        )
    with pytest.raises(ConfigError, match="num_generations=1: must be an integer >= 2"):
        GRPOConfig(
            output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=1, report_to="none"
        )


def test_cut_at_eos():
    assert cut_at_eos([5, 6, 2, 0, 0], eos_id=2) == [5, 6, 2]
    assert cut_at_eos([5, 6, 7], eos_id=2) == [5, 6, 7]
    assert cut_at_eos([5, 9, 6, 2], eos_id=[2, 9]) == [5, 9]  # any stop id ends the completion


def test_stop_ids_add_the_generation_configs_end_of_turn(tmp_path):
    """A chat model whose tokenizer EOS is not its end-of-turn token (Qwen2.5 base tokenizers: EOS
    <|endoftext|>, turn ends <|im_end|>) stops at either; the tokenizer's EOS comes first."""
    trainer, _ = _trainer(tmp_path)
    tok, model = trainer.processing_class, trainer.model
    assert stop_ids(tok, model) == [tok.eos_token_id]
    model.generation_config.eos_token_id = [tok.eos_token_id, 7]
    assert stop_ids(tok, model) == [tok.eos_token_id, 7]
    gen = HFGenerator(trainer.args, tok)
    torch.manual_seed(0)
    out = gen(model, [tok("p01", add_special_tokens=False)["input_ids"]] * 16)
    assert gen.config.eos_token_id == [tok.eos_token_id, 7]
    for ids in out:  # each completion ends at its first stop id, or runs to the length limit
        ends = [i for i, t in enumerate(ids) if t in (tok.eos_token_id, 7)]
        assert ends == [] and len(ids) == trainer.args.max_completion_length or ends == [len(ids) - 1]


def test_on_policy_ratio_is_one_and_gradient_is_plain_policy_gradient(tmp_path):
    """spg=1, one micro-step per optimizer step: no pi_old, ratio exp(logp - logp.detach()) == 1, and
    the GRPO (dapo) gradient equals that of the plain policy-gradient loss -sum(A * logp * mask) / n."""
    trainer, _ = _trainer(tmp_path, steps_per_generation=1, max_completion_length=6)
    trainer.generator = HFGenerator(trainer.args, trainer.processing_class)
    trainer.reward_funcs = {"ids": lambda completion_ids, **_: [float(sum(c) % 97) for c in completion_ids]}
    torch.manual_seed(0)
    model = trainer.model.train()
    rows = [
        {"prompt": p, "prompt_ids": trainer.processing_class(p, add_special_tokens=False)["input_ids"]}
        for p in ("p01", "p01", "p02", "p02")
    ]
    trainer.rollouts.micro_step = 0
    inputs = trainer._prepare_inputs(rows)
    assert inputs.old_logps is None
    assert inputs.advantages.abs().sum() > 0  # otherwise both gradients would be trivially 0

    model.zero_grad()
    trainer.compute_loss(model, inputs).backward()
    grpo_grads = [p.grad.clone() for p in model.parameters()]
    metrics = trainer.metrics.pop("train")
    assert metrics["clip_ratio/region_mean"] == 0.0

    model.zero_grad()
    ids = torch.cat([inputs.prompt_ids, inputs.completion_ids], 1)
    att = torch.cat([inputs.prompt_mask, inputs.completion_mask], 1)
    n = inputs.completion_ids.size(1)
    logits = model(input_ids=ids, attention_mask=att, position_ids=(att.cumsum(-1) - 1).clamp(min=0)).logits
    logps = selective_log_softmax(logits[:, -n - 1 : -1], inputs.completion_ids)
    mask = inputs.completion_mask.float()
    pg = -(inputs.advantages.unsqueeze(1) * logps * mask).sum() / inputs.num_items
    pg.backward()
    for g, p in zip(grpo_grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-7)


def test_old_logps_match_current_policy_before_any_update(tmp_path):
    """spg=4: pi_old is scored at generation time with the same forward as training, so on the first
    slice (no update yet) the ratio is 1 up to float noise and nothing is clipped."""
    trainer, _ = _trainer(tmp_path, max_completion_length=5)
    trainer.generator = HFGenerator(trainer.args, trainer.processing_class)
    trainer.model.train()
    rows = [
        {
            "prompt": f"p{i:02d}",
            "prompt_ids": trainer.processing_class(f"p{i:02d}", add_special_tokens=False)["input_ids"],
        }
        for i in range(8)
        for _ in range(2)
    ]
    trainer.rollouts.micro_step = 0
    inputs = trainer._prepare_inputs(rows)
    assert inputs.old_logps.shape == inputs.completion_ids.shape
    with torch.no_grad():
        logps, _ = trainer._token_logps(trainer.model, inputs.tokens())
    torch.testing.assert_close(logps, inputs.old_logps, rtol=0, atol=1e-5)


def test_off_policy_steps_by_hand():
    """Micro-step m is off-policy when an optimizer update (after every `ga` micro-steps) falls between
    its round's generation (micro-step spg*(m//spg)) and m:
    spg=1: every micro-batch is fresh -> none.  spg=4, ga=1: steps 2,3,4 use round 0 after 1,2,3 updates.
    spg=2, ga=4: a round never spans an update -> none.  spg=4, ga=2: micro 2,3 (step 2) after 1 update.
    spg=3, ga=2 (period 6 micro-steps = 3 steps): micro 2 (step 2), 4 and 5 (step 3) -> steps 2, 3."""
    assert off_policy_steps(1, 1) == []
    assert off_policy_steps(4, 1) == [2, 3, 4]
    assert off_policy_steps(2, 4) == []
    assert off_policy_steps(4, 2) == [2]
    assert off_policy_steps(3, 2) == [2, 3]


def test_batch_geometry_table():
    """B=16 completions, G=4 -> 4 prompts per micro-step; ga=2 -> 32 completions (8 prompts) per step;
    spg=4 -> 64 completions (16 prompts) per round; 10 steps = 20 micro-steps = 5 rounds."""
    from ablate.methods.grpo import GRPOConfig
    from ablate.rollouts.geometry import batch_geometry

    args = GRPOConfig(
        output_dir="/tmp/unused",
        per_device_train_batch_size=16,
        num_generations=4,
        steps_per_generation=4,
        gradient_accumulation_steps=2,
        use_cpu=True,
        report_to="none",
    )
    table = batch_geometry(args, world_size=1, max_steps=10)
    rows = {line[:24].strip(): line[24:].split() for line in table.splitlines()[2:5]}
    assert rows == {
        "per micro-step": ["4", "16", "1"],
        "per optimizer step": ["8", "32", "2"],
        "per generation round": ["16", "64", "4"],
    }
    assert "optimizer steps: 10   micro-steps: 20   generation rounds: 5" in table
    assert "off-policy optimizer steps: 2 of every 2" in table


def test_num_iterations_serves_each_round_mu_times(tmp_path):
    """spg=2, mu=2, 8 steps: a round feeds 4 micro-steps (slices 0, 1, 0, 1) -> 2 rounds; the ratio is
    against the round's policy, so pi_old is kept for every micro-step; off-policy steps 2, 3, 4 of 4."""
    gen = FakeGenerator(tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)[0])
    trainer, served = _trainer(tmp_path, generator=gen, steps_per_generation=2, num_iterations=2)
    trainer.train()
    assert len(gen.rounds) == 2 and trainer.rollout_stats().rounds == 2
    for r, prompts in enumerate(gen.rounds):
        slices = [prompts[0:4], prompts[4:8]]
        assert [s["prompts"] for s in served[4 * r : 4 * r + 4]] == [
            slices[0],
            slices[1],
            slices[0],
            slices[1],
        ]
    assert all(s["old"] for s in served)
    assert off_policy_steps(2, 1, num_iterations=2) == [2, 3, 4]
    assert off_policy_steps(1, 1, num_iterations=2) == [2]  # micro 1 reuses round 0 after 1 update
    assert off_policy_steps(1, 2, num_iterations=2) == []  # both passes inside one optimizer step
