"""GRPO on `transformers.Trainer` (Shao et al. 2024; TRL 1.16's GRPOTrainer): one generation round
feeds `steps_per_generation` micro-steps, each slice served `num_iterations` times (the schedule and
its diagram: ablate.rollouts.schedule). The train dataloader yields a round's prompts, each repeated
`num_generations` times, spg times in a row (RepeatSampler); `_prepare_inputs` generates and scores
on the first of those micro-steps and the `RolloutBuffer` serves slice k at micro-step k. Batches
count completions, so `per_device_train_batch_size` is a multiple of `num_generations`.

Departures from TRL: no shuffle of the round before slicing (slice k is exactly the prompts drawn for
micro-step k); position ids follow the left padding (training scores exactly what was sampled);
pi_old is scored at generation time only when the policy can change before the round is used
(Schedule.keeps_old_logps), else the ratio is exactly 1; a checkpoint saved mid-round holds the round
(`generation_buffer.pt`) and the generation counters, so a resume at any step reproduces the
uninterrupted run's per-step losses (TRL regenerates).

Seams, each chosen by config: `generator=` (none: the speed plan's SharedPromptGenerator, one prefill
per prompt group, or HFGenerator; `method/rollouts=hf|vllm`: an engine, whose own log-probs drive
TRL's importance-sampling correction, ablate.losses.is_correction); scoring by the speed plan (one
packed row per prompt group, or rows in length groups, else TRL's row per completion:
ablate.speed.scoring); the loss is the `objective` of a `LossInputs`, then the `aggregation`
(ablate.losses.grpo). Rounds sampled ahead by a worker process (async GRPO): ablate.rollouts.ahead.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable
from typing import Any

import torch
from datasets import Dataset
from torch import nn
from torch.utils.data import Sampler
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ablate.losses import grpo as grpo_losses
from ablate.losses import is_correction
from ablate.losses.grpo import _nanstd as nanstd
from ablate.losses.logps import logits_logps
from ablate.methods.forward import unconverted
from ablate.methods.fsdp import full_params
from ablate.methods.grpo_config import GRPOConfig
from ablate.methods.rollout import RolloutTrainer
from ablate.models.adapters import is_adapted, reference_forward
from ablate.rollouts import rewarding
from ablate.rollouts.ahead import AheadRounds, check_async
from ablate.rollouts.buffer import Rollout
from ablate.rollouts.engine_ahead import EngineRounds
from ablate.rollouts.generation import (
    Completions,
    GenerateFn,
    HFGenerator,
    as_completions,
    left_pad,
    right_pad,
    stop_ids,
)
from ablate.rollouts.geometry import PrintGeometry
from ablate.rollouts.sampler import RepeatSampler
from ablate.rollouts.schedule import Schedule
from ablate.rollouts.stats import completion_metrics
from ablate.rollouts.turns import ToolGenerator, build_toolbox, tool_metrics, turns_of
from ablate.schema import fits
from ablate.speed import plan as speed_plan
from ablate.speed import scoring
from ablate.speed.plan import PrintPlan, Setting, SpeedPlan, SpeedSwitches
from ablate.speed.split import takes_logits_to_keep

RewardFunc = rewarding.RewardFunc


def _check_finite(model: nn.Module, step: int) -> None:
    """NaN/inf weights (a diverged update, e.g. too high an lr) as one line, before sampling from them."""
    params = [p for p in model.parameters() if p.is_floating_point()]
    if params and not torch.stack([torch.isfinite(p).all() for p in params]).all():
        raise FloatingPointError(
            f"the policy's weights are NaN/inf before the generation round at step {step} "
            "(training diverged): lower optimizer.optimizer.lr"
        )


class GRPOTrainer(RolloutTrainer):
    """Group Relative Policy Optimization (Shao et al. 2024) with buffered generation rounds (its round
    loop, checkpoints and counters: ablate.methods.rollout.RolloutTrainer)."""

    speed_paths = (
        speed_plan.GRPO
    )  # the speed paths its scoring runs (ablate.speed.plan; `ablate plan` reads them)

    def __init__(
        self,
        model: PreTrainedModel,
        args: GRPOConfig,
        train_dataset: Dataset,
        processing_class: PreTrainedTokenizerBase,
        reward_funcs: dict[str, RewardFunc] | None = None,
        eval_dataset: Dataset | None = None,
        generator: GenerateFn | None = None,
        aggregation: grpo_losses.Aggregation = grpo_losses.dapo,
        objective: grpo_losses.Objective = grpo_losses.clip,
        reward_aggregation: grpo_losses.Advantages = grpo_losses.sum_then_normalize,
        scale_rewards: grpo_losses.Scale = grpo_losses.group_std,
        perf: SpeedSwitches | None = None,
        **kwargs: Any,
    ) -> None:
        # tools and environments (ablate.rollouts.turns); None: none
        self.toolbox = build_toolbox(args, processing_class)
        reward_funcs, weights = rewarding.gather(reward_funcs, args.reward_weights, self.toolbox)
        self.perf = perf or SpeedSwitches()
        train_dataset, eval_dataset = self._prompt_splits(train_dataset, eval_dataset, processing_class, args)
        # which speed paths run (ablate.speed.plan)
        self.speed_plan = self._policy_plan(model, args, generator)
        super().__init__(
            model=model,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            **kwargs,
        )
        self.reward_funcs = dict(reward_funcs)
        self._warned: set[str] = set()  # what the rewards said once (a round no function scored)
        # one line, before round 1
        rewarding.ready(self.reward_funcs, train_dataset, self.toolbox, self.args.device)
        self.reward_weights = torch.tensor(weights, dtype=torch.float32)
        # per-token losses -> one number
        self.aggregate = fits(aggregation, grpo_losses.dapo, "method.grpo_aggregation")
        self.scale_rewards = scale_rewards  # method/grpo_scale_rewards=NAME: the advantages' denominator
        self.objective = objective  # method/grpo_objective=NAME: the per-token loss (clip, cispo, sapo)
        # method/grpo_reward_aggregation=NAME: rewards -> advantages
        self.reward_aggregation = reward_aggregation
        # None: the plan's choice, SharedPromptGenerator (shared_prefill) or model.generate
        default = None if self.speed_plan.on("shared_prefill") else HFGenerator
        self.generator = self._start_generator(default if generator is None else generator, args)
        if self.toolbox is not None:  # tool calls between turns, whichever engine samples them
            self.generator = ToolGenerator(
                self.generator, self.toolbox, processing_class, args.max_completion_length
            )
        self.ref_model = None  # with beta > 0 and LoRA adapters: the policy with its adapters disabled
        self.ref_speed_plan: SpeedPlan | None = None
        if args.beta != 0.0 and not is_adapted(model):  # a frozen copy of the initial policy, as in DPO
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False).to(self.args.device)
            self.ref_speed_plan = speed_plan.resolve(  # never wrapped: its plan may differ (DDP)
                "reference",
                Setting.of(self.ref_model, args, self._longest_row(args), reference=True),
                self.perf,
                speed_plan.GRPO_REFERENCE,
            )
            speed_plan.apply(self.ref_model, self.ref_speed_plan)
        # the batch geometry and the speed plan, printed together once the step count is known
        self.add_callback(PrintGeometry())
        self.add_callback(PrintPlan(self.speed_plan, self.ref_speed_plan, show=self.perf.show))
        self._serve_rounds(Schedule.from_args(args))
        if self.schedule.staleness:  # rounds sampled ahead (async GRPO)
            self.ahead = self._rounds_ahead(args)

    def _rounds_ahead(self, args: GRPOConfig) -> AheadRounds | EngineRounds:
        """Asynchronous GRPO's sampler: an engine of its own (vLLM colocated or a server) samples ahead
        from a thread of the trainer (ablate.rollouts.engine_ahead); otherwise a forked CPU worker with its
        own copy of the weights (ablate.rollouts.ahead)."""
        s, model = self.schedule.staleness, self.accelerator.unwrap_model(self.model)
        if getattr(self.generator, "gathers_weights", False):
            stops = stop_ids(self.processing_class, model)
            return EngineRounds(self.generator, model, args, self._round_prompts, stops)
        check_async(s, args, self.generator)
        dtype = getattr(torch, args.generation_dtype) if args.generation_dtype else None  # the worker's
        return AheadRounds(
            self._sample_ahead,
            model,
            s,
            args.seed,
            self._round_prompts,
            dtype=dtype,
            balanced=args.async_threads == "balanced",
            timeout_s=args.worker_timeout_s,
        )

    def _policy_plan(self, model: nn.Module, args: GRPOConfig, generator: Any) -> SpeedPlan:
        """The policy's speed plan, applied to it (lean layers, packed attention). A generator given as
        `method.trainer.generator` is used as it is."""
        given = getattr(generator, "func", generator)  # a class, a partial of one, or a GenerateFn
        name = getattr(given, "__name__", type(given).__name__)
        blocked = {} if generator is None else {"shared_prefill": f"method.trainer.generator is set: {name}"}
        plan = speed_plan.resolve(
            "policy", Setting.of(model, args, self._longest_row(args)), self.perf, self.speed_paths, blocked
        )
        speed_plan.apply(model, plan)
        return plan

    def _prompt_encoder(self) -> Callable[..., list[int]] | None:
        """With tools, the prompt offers them (ablate.rollouts.turns)."""
        return self.toolbox.prompt_ids if self.toolbox is not None else None

    # ---- batching: one generation batch, served by the buffer as `steps_per_generation` slices ----

    def _get_eval_sampler(self, eval_dataset: Dataset) -> Sampler[int]:
        prompts = self.args.per_device_eval_batch_size // self.args.num_generations
        return RepeatSampler(eval_dataset, self.args.num_generations, prompts, 1, self.args.seed)

    def _round_prompts(self, k: int) -> list[list[int]]:
        """Round k's prompt ids, read ahead of the dataloader from the sampler (asynchronous GRPO)."""
        rows = self._get_train_sampler().round_indices(k, self.accelerator.process_index)
        return [self.train_dataset[i]["prompt_ids"] for i in rows]

    def _prepare_inputs(self, inputs: list[dict[str, Any]]) -> Rollout:
        served = super()._prepare_inputs(inputs)
        if not self.model.training:  # eval: one batch, generated and scored on the spot
            return served
        if self.ahead is not None:  # TRL's names: optimizer steps between the sampling policy and this one
            stale = float(self.state.global_step - served.policy_version)  # and the version that sampled it
            self.metrics.add(
                "train", {"sample/staleness_mean": stale, "sample/model_version": served.policy_version}
            )
        # tokens trained on, for tokens/s and MFU (ablate.speed.throughput)
        tokens = served.prompt_mask.sum() + served.completion_mask.sum()
        self.state.num_input_tokens_seen += int(self.accelerator.gather(tokens).sum())
        return served

    def _train_round(self, rows: list[dict[str, Any]]) -> Rollout:
        return self._generate_and_score(rows, "train") if self.ahead is None else self._take_ahead(rows)

    # ---- one generation round ----

    def _generate_and_score(self, rows: list[dict[str, Any]], mode: str) -> Rollout:
        """Generate a completion per row, score it, and return the round's padded tensors the loss needs."""
        t0 = time.perf_counter()
        # NaN logits fail deep in generate()
        _check_finite(self.accelerator.unwrap_model(self.model), self.state.global_step)
        # the policy may change before (some) use; RLOO's KL penalty reads pi_old when the round is scored
        keep_old = mode == "train" and self.schedule.keeps_old_logps or self._kl_penalty()
        # with tools: the environments reset for these rows (their text may extend the prompts)
        prompt_ids = (
            self.generator.start(rows) if self.toolbox is not None else [r["prompt_ids"] for r in rows]
        )
        out, batch, seconds = self._behaviour(self.model, prompt_ids, keep_old)
        return self._score(rows, out, batch, mode, seconds, self.state.global_step, t0)

    def _behaviour(
        self, model: nn.Module, prompt_ids: list[list[int]], keep_old: bool, old_from_sampling: bool = False
    ) -> tuple[Completions, dict[str, torch.Tensor], float]:
        """The sampling policy's part of a round: completions, padded batch, pi_old's log-probs (with
        `keep_old`; the async worker's from its sampling logits, `old_from_sampling`, not a second
        forward)."""
        t0 = time.perf_counter()
        sample = getattr(self.generator, "sample", None) if old_from_sampling else None
        unwrapped = self.accelerator.unwrap_model(model)
        # FSDP2: ranks may stop decoding apart, so the HF paths decode on the whole model; an engine (vLLM)
        # holds its own copy, and its push gathers one unit at a time (ablate.rollouts.weights)
        gathers = getattr(self.generator, "gathers_weights", False)
        with contextlib.nullcontext(unwrapped) if gathers else full_params(unwrapped) as whole:
            out = (
                sample(whole, prompt_ids, policy_logps=True)
                if sample
                else as_completions(self.generator(whole, prompt_ids))
            )
        seconds = time.perf_counter() - t0
        batch = self._completion_batch(prompt_ids, out.ids)
        if out.tool_mask is not None:  # tool results: attended to, never trained on (TRL's tool_mask)
            batch["tool_mask"] = right_pad(out.tool_mask, 1)[0].to(self.args.device)
        if out.logps is not None:  # an engine's own log-probs (vLLM): compute_loss corrects for its mismatch
            batch["sampling_logps"] = right_pad(out.logps, 0.0, torch.float32)[0].to(self.args.device)
        if out.policy_logps is not None:
            batch["old_logps"] = right_pad(out.policy_logps, 0.0, torch.float32)[0].to(self.args.device)
        elif keep_old:
            with torch.no_grad():
                batch["old_logps"] = self._token_logps(model, batch)[0]
        return out, batch, seconds

    def _sample_ahead(
        self, model: nn.Module, prompt_ids: list[list[int]]
    ) -> tuple[list[list[int]], torch.Tensor, float, dict[str, Any]]:
        """The async worker's `BehaviourFn` (ablate.rollouts.ahead): completions, their log-probs, and what
        a round with tool calls adds (tool mask, messages, counts)."""
        out, batch, seconds = self._behaviour(model, prompt_ids, keep_old=True, old_from_sampling=True)
        return out.ids, batch["old_logps"], seconds, turns_of(out)

    def _take_ahead(self, rows: list[dict[str, Any]]) -> Rollout:
        """Asynchronous GRPO: this round as the worker sampled it (waiting for it if it is not done yet);
        hands the worker the current weights for round + s."""
        t0 = time.perf_counter()
        schedule = self.schedule
        steps = self.state.max_steps * schedule.accumulation
        self.ahead.last_round = -(-steps // schedule.micro_steps_per_round)
        # what the worker gets next
        _check_finite(self.accelerator.unwrap_model(self.model), self.state.global_step)
        prompt_ids = [r["prompt_ids"] for r in rows]
        sampled = self.ahead.take(
            schedule.round_of(self.rollouts.micro_step), prompt_ids, self.state.global_step
        )
        waited = time.perf_counter() - t0  # what generation costs the training loop: its wait
        out = Completions(ids=sampled.completion_ids, **(sampled.turns or {}))
        batch = self._completion_batch(prompt_ids, out.ids)
        batch["old_logps"] = sampled.old_logps.to(self.args.device)
        if out.tool_mask is not None:
            batch["tool_mask"] = right_pad(out.tool_mask, 1)[0].to(self.args.device)
        self.rollouts.stats.background_seconds += sampled.seconds
        return self._score(
            rows, out, batch, "train", waited, sampled.policy_version, t0, round_seconds=sampled.seconds
        )

    def _completion_batch(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]]
    ) -> dict[str, torch.Tensor]:
        """The padded prompt and completion tensors on the device; truncated completions masked out
        with `mask_truncated_completions`."""
        batch = self._pad_batch(prompt_ids, completion_ids)
        if self.args.mask_truncated_completions:  # no loss on completions cut off at max_completion_length
            truncated = self._truncated(completion_ids)
            batch["completion_mask"] = batch["completion_mask"] * ~torch.tensor(truncated).unsqueeze(1)
        return {k: v.to(self.args.device) for k, v in batch.items()}

    def _truncated(self, completion_ids: list[list[int]]) -> list[bool]:
        """Which completions have no EOS: cut at the length cap."""
        stops = set(stop_ids(self.processing_class, self.accelerator.unwrap_model(self.model)))
        return [not ids or ids[-1] not in stops for ids in completion_ids]

    def _score(
        self,
        rows: list[dict[str, Any]],
        out: Completions,
        batch: dict[str, torch.Tensor],
        mode: str,
        seconds: float,
        version: int,
        t0: float,
        round_seconds: float | None = None,
    ) -> Rollout:
        """The rest of a round once it is sampled: reference log-probs, rewards, advantages, metrics and the
        counters. `seconds`: what generation cost the training loop (sampling, or waiting for the worker)."""
        train, stats = mode == "train", self.rollouts.stats  # only training rounds are counted
        completion_ids = out.ids
        # completion lengths count the model's own tokens (tool results are not the model's: TRL's tool_mask)
        lengths = torch.tensor(
            [sum(m) for m in out.tool_mask]
            if out.tool_mask is not None
            else [len(ids) for ids in completion_ids],
            dtype=torch.float32,
        )
        if train:
            stats.rounds += 1
            stats.generation_seconds += seconds
            stats.generated_tokens += sum(len(ids) for ids in completion_ids)
            # TRL's num_tokens: prompt + completion tokens seen so far (before any masking)
            stats.num_tokens += int(batch["prompt_mask"].sum()) + int(lengths.sum())
        truncated = self._truncated(completion_ids)
        with torch.no_grad():
            if self.ref_model is not None:
                batch["ref_logps"] = self._token_logps(self.ref_model, batch)[0]
            elif self.args.beta != 0.0:  # LoRA: the reference is the base model (adapters off)
                with reference_forward(self.model, self.accelerator.unwrap_model(self.model)):
                    batch["ref_logps"] = self._token_logps(self.model, batch)[0]
        rewards = self._rewards(rows, out)
        loss_mask = batch["completion_mask"] * batch.get("tool_mask", 1)
        # RLOO: the estimator subtracts beta * KL (the model's tokens) from the rewards
        penalty = {}
        if self._kl_penalty():
            penalty = {"token_kl": batch["old_logps"] - batch["ref_logps"], "mask": loss_mask}
        advantages, metrics = self.reward_aggregation(
            rewards, self.reward_weights, self.args.num_generations, self.scale_rewards, **penalty
        )
        rewarding.check_advantages(advantages, self.reward_aggregation, self.state.global_step)
        # dapo's normaliser: completion tokens per micro-batch, averaged over the generation batch, so
        # after Trainer's division by the accumulation steps it is TRL's tokens-per-window
        slices = self.schedule.steps_per_generation if train else 1
        rollout = Rollout(
            **batch,
            advantages=advantages.to(self.args.device),
            num_items=self._tokens_per_rank(loss_mask) / slices,
            policy_version=version,
        )
        for i, name in enumerate(self.reward_funcs):
            column = grpo_losses.headroom(rewards[:, i])  # +-3e38: its mean and std in float64
            metrics.update(
                {f"rewards/{name}/mean": torch.nanmean(column), f"rewards/{name}/std": nanstd(column)}
            )
        metrics.update(completion_metrics(lengths.tolist(), truncated))  # TRL's completions/*
        metrics["num_tokens"] = float(stats.num_tokens)  # TRL's
        # ablate's own
        metrics["timing/generation_seconds"] = seconds if round_seconds is None else round_seconds
        if out.tool_calls is not None:  # TRL's: calls per completion, and the failed share of the calls made
            metrics.update(tool_metrics(out.tool_calls, out.tool_failures, out.tool_truncated))
        self.metrics.add(mode, metrics)
        if train:  # time/scoring: the round's time after generation (padding, log-probs, rewards)
            stats.scoring_seconds += time.perf_counter() - t0 - seconds
        return rollout

    def _tokens_per_rank(self, loss_mask: torch.Tensor) -> torch.Tensor:
        """The round's loss tokens averaged over the ranks (TRL's num_items_in_batch / num_processes):
        each rank normalises by the same count, so DDP's mean of the ranks' gradients is the one-process
        gradient of the same global batch."""
        return self.accelerator.gather(loss_mask.sum().float().reshape(1)).mean()

    def _kl_penalty(self) -> bool:
        """Whether the KL is a reward penalty the estimator needs at scoring time (RLOO with beta > 0)."""
        return self.args.kl_in_reward and self.args.beta != 0.0

    def _pad_batch(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]]
    ) -> dict[str, torch.Tensor]:
        pad_id = self.processing_class.pad_token_id
        p_ids, p_mask = left_pad(prompt_ids, pad_id)
        c_ids, c_mask = right_pad(completion_ids, pad_id)
        return dict(prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=c_ids, completion_mask=c_mask)

    def _rewards(self, rows: list[dict[str, Any]], out: Completions) -> torch.Tensor:
        """(N, F) reward table (ablate.rollouts.rewarding; ablate.rewards.calls checks what each function
        returns)."""
        environments = getattr(self.generator, "environments", None)  # this round's, one per row (TRL's)
        return rewarding.table(
            self.reward_funcs, rows, out, self.processing_class, environments, self._warned
        )

    # ---- loss ----

    def _token_logps(
        self, model: nn.Module, batch: dict[str, torch.Tensor], with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs (and entropies) of the completion under `model`, at the sampling temperature,
        by the model's speed plan (ablate.speed.scoring.group_logps: each prompt once per group, or rows in
        length groups); with those paths off, `_rows_logps`: the same values, TRL's layout."""
        plan = self.ref_speed_plan if model is self.ref_model and model is not None else self.speed_plan
        if not plan.any_on("grpo_group_rows", "length_groups"):
            return self._rows_logps(model, batch, with_entropy)
        # the split calls the policy's backbone around model.forward, where accelerate puts its autocast;
        # the reference model's forward has none
        autocast = None if model is self.ref_model else self.accelerator.autocast()
        return scoring.group_logps(
            model,
            batch,
            plan,
            self._rows_logps,
            self.args.temperature,
            self.processing_class.pad_token_id,
            with_entropy,
            autocast,
        )

    def _rows_logps(
        self, model: nn.Module, batch: dict[str, torch.Tensor], with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`_token_logps` of one (sub-)batch in one forward pass (TRL's layout: one row per completion)."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        # as generate() sets them under left padding
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        n = batch["completion_ids"].size(1)
        # project to the vocabulary only where a completion token is predicted (prompt logits are never used)
        keep = {"logits_to_keep": n + 1} if takes_logits_to_keep(self.accelerator.unwrap_model(model)) else {}
        # no float32 copy of the logits (ablate.methods.forward)
        forward = unconverted(self.accelerator, model)
        logits = forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **keep,
        ).logits
        # the last n + 1 positions score the n completion tokens and, the last, nothing (a dummy target,
        # dropped): no float32 copy of the logits, the entropy from the same pass (ablate.losses.logps)
        targets = torch.cat([batch["completion_ids"], batch["completion_ids"][:, :1]], dim=1)
        logps, stats = logits_logps(
            logits if keep else logits[:, -n - 1 :], targets, self.args.temperature, with_stats=with_entropy
        )
        return logps[:, :-1], (stats["entropy"][:, :-1] if with_entropy else None)

    def compute_loss(
        self,
        model: nn.Module,
        inputs: Rollout,
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        mode = "train" if model.training else "eval"
        logps, entropy = self._token_logps(model, inputs.tokens(), with_entropy=True)
        mask = inputs.loss_mask().float()  # tool results (tool_mask 0) are attended to, not trained on
        # ratio exactly 1 when on-policy
        old = logps.detach() if inputs.old_logps is None else inputs.old_logps
        a = self.args
        # TRL's correction for an engine's sampling and the off-policy mask (ablate.losses.is_correction)
        weight, metrics = is_correction.policy_weight(
            logps, old, inputs.sampling_logps, inputs.advantages, mask, a
        )
        per_token, own = self.objective(
            grpo_losses.LossInputs(logps, old, inputs.advantages, mask, inputs.ref_logps, weight),
            epsilon=a.epsilon,
            epsilon_high=a.epsilon_high,
            beta=a.beta,
            delta=a.delta,
            importance_sampling_level=a.importance_sampling_level,
            bias_correction_kl=a.use_bias_correction_kl,
        )
        loss = self.aggregate(
            per_token, mask, num_items=float(inputs.num_items), max_completion_length=a.max_completion_length
        )
        metrics.update(own)
        metrics["entropy"] = grpo_losses.masked_mean(entropy, mask)
        self.metrics.add(mode, metrics)
        return loss
