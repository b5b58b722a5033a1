"""DPO on `transformers.Trainer`: tokenise pairs, one forward over `[chosen; rejected]`, call a loss.

Departures from the paper's pseudo-code, all as in TRL: log-probs are summed over completion tokens
only; reference log-probs are precomputed once before training by default (the reference is the
initial policy, so no second model stays in memory; the `cache` group reuses them, and the tokenized
pairs and an eval's forwards at step 0, across runs with the same key: ablate.data.cache,
ablate.methods.initial_eval); EOS ends every completion.

Speed paths (conf/speed/), each exact (tests/unit/test_dpo_speed_paths.py) and switchable for ablation:
`dpo_pair_rows` runs one row `[prompt | chosen | rejected]` per pair (ablate.speed.pairs),
`completion_only_logits` applies the LM head only where a completion token is scored, in chunks
(ablate.losses.logps.completion_logps, ablate.speed.split), `padding_free` sends only the batch's real
tokens through the model, attention kept per row (ablate.speed.packing), `lean_layers` saves less for
backward (ablate.speed.lean). Which of them run is decided once, in `__init__` (ablate.speed.plan: the
model, attention, device, wrapper), printed when training starts and recorded in run.json. With all
of them off, and for the eval logits a `compute_metrics` hook receives, `_sequence_logps` runs the
plain path: TRL's layout and full logits.
"""

from __future__ import annotations

import copy
import hashlib
import logging
from collections.abc import Callable
from typing import Any

import torch
from datasets import Dataset
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ablate.data import cache as reuse
from ablate.data.tokenize import prepare_preference
from ablate.losses import dpo as dpo_losses
from ablate.losses.logps import per_sequence, sequence_logps, shifted_logps
from ablate.losses.reference_free import declares
from ablate.methods import initial_eval
from ablate.methods.base import AblateTrainer
from ablate.methods.dpo_config import DPOConfig
from ablate.methods.forward import unconverted
from ablate.methods.metrics import completion_token_metrics
from ablate.methods.tokenized import TokenizedRows
from ablate.models.adapters import is_adapted, reference_forward
from ablate.schema import fits
from ablate.speed import plan as speed_plan
from ablate.speed.pairs import plain_pairs, shared_prompt_pairs
from ablate.speed.plan import PrintPlan, Setting, SpeedPlan, SpeedSwitches
from ablate.speed.scoring import pair_logps
from ablate.speed.split import keep_from

logger = logging.getLogger("ablate")


class DPOCollator:
    """Pads a list of tokenised pairs into one batch: rows 0..B-1 chosen, B..2B-1 rejected (TRL's layout).

    With `share_prompt` (the speed plan's `dpo_pair_rows`) it also adds the shared-prompt layout
    (`ablate.speed.pairs`) under `shared_*` keys, which the trainer's forward uses; the plain keys stay
    (TRL's `num_tokens`, eval logits)."""

    def __init__(self, pad_token_id: int, share_prompt: bool = False, with_mask: bool = True) -> None:
        self.pad_token_id = pad_token_id
        self.share_prompt = share_prompt
        # the shared layout's 4-D mask (not when a packed row's document mask replaces it)
        self.with_mask = with_mask

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = plain_pairs(rows, self.pad_token_id)
        if self.share_prompt:
            shared = shared_prompt_pairs(rows, self.pad_token_id, with_mask=self.with_mask)
            batch.update({f"shared_{k}": v for k, v in shared.items()})
        if "ref_chosen_logps" in rows[0]:
            batch["ref_chosen_logps"] = torch.tensor([r["ref_chosen_logps"] for r in rows])
            batch["ref_rejected_logps"] = torch.tensor([r["ref_rejected_logps"] for r in rows])
            if batch["ref_chosen_logps"].isnan().any():  # a row DPOTrainer._rows_used did not foresee
                raise RuntimeError(
                    "DPO: a train pair without a precomputed reference log-prob was drawn; "
                    "set method.args.precompute_ref_log_probs=false and report this"
                )
        return batch


def _loss_result(fn: Any, out: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """What a loss (`method.dpo_loss`, possibly the user's) returned, if it is (per-pair losses: a tensor,
    metrics: a dict); else one line naming it (UserCodeError) instead of a traceback further on."""
    if (
        isinstance(out, tuple)
        and len(out) == 2
        and isinstance(out[0], torch.Tensor)
        and isinstance(out[1], dict)
    ):
        return out
    from ablate.errors import UserCodeError

    f = getattr(fn, "func", fn)
    got = f"a {type(out).__name__}"
    if isinstance(out, tuple):
        got = f"({', '.join(type(x).__name__ for x in out)})"
    raise UserCodeError(
        f"method.dpo_loss ({f.__module__}.{f.__qualname__}) returned {got}: a DPO loss returns "
        "(losses, metrics): a tensor of per-pair losses and a dict of metrics (ablate.losses.dpo)"
    )


class DPOTrainer(TokenizedRows, AblateTrainer):
    """Direct Preference Optimization (Rafailov et al. 2023) with the loss given as `loss` (a
    `losses.dpo` function or any with its signature; config: `method/dpo_loss=NAME`, `method.trainer.loss`)
    and the speed switches as `perf` (config: the `speed` group; None: all requested). A loss marked
    `reference_free` (ORPO, CPO, SimPO: ablate.losses.reference_free) gets no reference: none is scored."""

    tokenize = staticmethod(prepare_preference)  # any TRL preference format -> prompt/chosen/rejected ids
    row = "pair"
    speed_paths = speed_plan.DPO  # the speed paths it runs (ablate.speed.plan; `ablate plan` reads them)
    tokenize_args = ("max_length", "max_prompt_length", "max_completion_length")

    def __init__(
        self,
        model: PreTrainedModel,
        args: DPOConfig,
        train_dataset: Dataset | None,
        processing_class: PreTrainedTokenizerBase,
        eval_dataset: Dataset | None = None,
        ref_model: PreTrainedModel | None = None,
        data_collator: Callable | None = None,
        loss: dpo_losses.DPOLoss = dpo_losses.sigmoid,
        perf: SpeedSwitches | None = None,
        cache: reuse.Cache | None = None,
        **kwargs: Any,
    ) -> None:
        self.loss_fn = fits(loss, dpo_losses.sigmoid, "method.dpo_loss")  # before any data is tokenised
        # what the loss declares (ablate.losses.reference_free): no reference; the prompt tokens scored too
        self.reference_free = declares(loss, "reference_free")
        self.scores_prompt = declares(loss, "scores_prompt")
        self.perf = perf or SpeedSwitches()
        # tokenized pairs, reference log-probs (ablate.data.cache)
        self.cache = cache or reuse.Cache(enabled=False)
        # which speed paths run (ablate.speed.plan)
        self.speed_plan = self._policy_plan(model, args, data_collator)
        self.ref_speed_plan: SpeedPlan | None = None  # a live reference model's own
        if train_dataset is not None:  # None: evaluation only (`ablate eval`)
            train_dataset = self._prepare_dataset(train_dataset, processing_class, args, "train")
        if eval_dataset is not None:
            eval_dataset = self._prepare_dataset(eval_dataset, processing_class, args, "eval")
        collator = data_collator or DPOCollator(
            processing_class.pad_token_id,
            share_prompt=self.speed_plan.on("dpo_pair_rows"),
            # packed rows need no [width, width] mask from the collator (rebuilt from segments if used)
            with_mask=not self.speed_plan.on("padding_free"),
        )
        super().__init__(model, args, collator, train_dataset, eval_dataset, processing_class, **kwargs)
        self.num_tokens = 0
        self.initial_forwards: initial_eval.Forwards | None = None  # an eval at step 0 replaying or recording
        # ref_model None: the reference is the policy itself, as it starts (precomputed) or, with LoRA
        # adapters, with its adapters disabled (the base model, scored live: no copy, as in TRL)
        self.ref_model = None
        if self.reference_free:
            pass  # no reference forward, no reference column, no reference cache entry
        elif args.precompute_ref_log_probs and ref_model is None:
            if self.train_dataset is not None:
                self.train_dataset = self._with_ref_logps(self.train_dataset)
            if self.eval_dataset is not None:
                self.eval_dataset = self._with_ref_logps(self.eval_dataset)
        elif ref_model is not None or not is_adapted(model):
            # a live reference: the given model (e.g. 8-bit) or a frozen copy of the initial policy
            self.ref_model = ref_model if ref_model is not None else copy.deepcopy(model)
            self.ref_model.eval().requires_grad_(False)
            self.ref_speed_plan = self._reference_plan(self.ref_model, args)
            if ref_model is None or getattr(ref_model, "hf_device_map", None) is None:
                self.ref_model.to(self.args.device)
        # the plan's table, when training starts
        self.add_callback(PrintPlan(self.speed_plan, self.ref_speed_plan, show=self.perf.show))

    def _policy_plan(self, model: nn.Module, args: DPOConfig, data_collator: Callable | None) -> SpeedPlan:
        """The policy's speed plan, applied to it (lean layers, packed attention). A user's collator
        builds TRL's rows only."""
        blocked = {}
        if data_collator is not None:
            blocked = {"dpo_pair_rows": "method.trainer.data_collator is set (it builds TRL's rows)"}
        if self.scores_prompt:  # these paths score completion tokens only
            blocked = {
                k: "the loss scores the prompt tokens"
                for k in ("dpo_pair_rows", "padding_free", "completion_only_logits")
            }
        plan = speed_plan.resolve(
            "policy", Setting.of(model, args, longest_row(args)), self.perf, self.speed_paths, blocked
        )
        speed_plan.apply(model, plan)
        return plan

    def _reference_plan(self, ref_model: nn.Module, args: DPOConfig) -> SpeedPlan:
        """A live reference model's own plan (another model, maybe quantized, never wrapped), applied to
        it; it scores the batches the policy's plan had built."""
        layout = (
            {}
            if self.speed_plan.on("dpo_pair_rows")
            else {"dpo_pair_rows": "the policy's batches are TRL's rows"}
        )
        plan = speed_plan.resolve(
            "reference",
            Setting.of(ref_model, args, longest_row(args), reference=True),
            self.perf,
            speed_plan.DPO_REFERENCE,
            layout,
        )
        speed_plan.apply(ref_model, plan)
        return plan

    def _sequence_logps(
        self, model: nn.Module, batch: dict[str, torch.Tensor], need_logits: bool = False
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Log-probs of `[chosen; rejected]` (2B,), and what the token metrics need: `logits` (plain
        path, or `need_logits`) or per-token `stats` with each token's sequence `seq`."""
        plan = self.ref_speed_plan if model is self.ref_model and model is not None else self.speed_plan
        if need_logits or not plan.any_on("dpo_pair_rows", "padding_free", "completion_only_logits"):
            return self._plain_logps(model, batch, need_logits)
        # accelerate puts bf16/fp16 autocast around model.forward; the backbone's own call needs it too
        with self.accelerator.autocast():
            token, stats, seq = pair_logps(model, batch, plan)
        return per_sequence(token, seq, batch["input_ids"].shape[0]), {"stats": stats, "seq": seq}

    def _plain_logps(
        self, model: nn.Module, batch: dict[str, torch.Tensor], need_logits: bool = False
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The plain path (TRL's layout; the speed paths equal it): rows [chosen; rejected] through the
        model's own forward, logits from the first position that scores a completion token on
        (`logits_to_keep`: the ones before are never used), log-probs and token stats from them in one
        pass without a float32 copy (ablate.losses.logps.logits_logps), so nothing holds the logits
        after it. `need_logits` (a compute_metrics hook): every position's, returned too."""
        ids, mask = batch["input_ids"], batch["completion_mask"][:, 1:]
        keep = (
            {} if need_logits or self.scores_prompt else keep_from(self.accelerator.unwrap_model(model), mask)
        )
        # no float32 copy of the logits (ablate.methods.forward), but a compute_metrics hook gets accelerate's
        forward = model if need_logits else unconverted(self.accelerator, model)
        logits = forward(
            input_ids=ids, attention_mask=batch["attention_mask"], use_cache=False, **keep
        ).logits
        token, stats = shifted_logps(logits, ids)
        mask = mask[:, mask.shape[1] - token.shape[1] :]
        row, col = mask.nonzero(as_tuple=True)  # the scored tokens, as the speed paths list them
        out = {"stats": {name: x[row, col] for name, x in stats.items()}, "seq": row}
        # the prompt tokens but the first (nothing predicts it), for a loss that wants them
        if self.scores_prompt:
            prompt = batch["attention_mask"][:, 1:] * (1 - batch["completion_mask"][:, 1:])
            out["prompt_logps"], out["prompt_n"] = sequence_logps(token, prompt), prompt.sum(-1)
        return sequence_logps(token, mask), ({**out, "logits": logits} if need_logits else out)

    def _reference_logps(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Reference log-probs of `[chosen; rejected]`: the live reference model's, or (ref_model None)
        `model`'s with adapters disabled, or `model`'s as it is (the initial policy, when precomputing)."""
        if self.ref_model is not None:
            with torch.no_grad():
                return self._sequence_logps(self.ref_model, batch)[0]
        if is_adapted(self.accelerator.unwrap_model(model)):
            with reference_forward(model, self.accelerator.unwrap_model(model)):
                return self._sequence_logps(model, batch)[0]
        with torch.no_grad():
            return self._sequence_logps(model, batch)[0]

    @torch.inference_mode()  # no autograd bookkeeping at all: these log-probs are constants
    def _with_ref_logps(self, dataset: Dataset) -> Dataset:
        """Add ref_chosen_logps / ref_rejected_logps columns, scored by the model as it is now (or
        loaded from the cache: the same numbers, for the same weights, rows, layout and device).

        Only the rows the run will draw are scored (`_rows_used`: a 3-step run of 8 pairs a step on 512
        pairs scores 32, its 3 batches and the one collated ahead);
        the others get NaN, which the collator refuses should one ever be drawn."""
        rows = self._rows_used(dataset) if dataset is self.train_dataset else None
        rows = list(range(len(dataset))) if rows is None else rows
        name = "train" if dataset is self.train_dataset else "eval"
        scored = self.cache.dataset(
            "ref_logps",
            f"reference log-probs of {len(rows)} {name} pairs",
            lambda: self._ref_key(dataset, rows),
            lambda: self._score_ref(dataset, rows, name),
        )
        columns = scored[:]  # {name: list of floats}
        return dataset.add_column("ref_chosen_logps", columns["ref_chosen_logps"]).add_column(
            "ref_rejected_logps", columns["ref_rejected_logps"]
        )

    def _ref_key(self, dataset: Dataset, rows: list[int]) -> dict[str, Any]:
        """Everything a reference log-prob's bits depend on: the tokenized rows and which are scored,
        the weights, the batch size (padding), the speed plan's layout, precision, device, code."""
        args = self.args
        return {
            "rows": reuse.rows_digest(dataset),
            "scored": hashlib.sha256(str(rows).encode()).hexdigest(),
            "weights": reuse.weights_digest(self.model),
            "adapted": is_adapted(self.model),
            "batch_size": args.per_device_eval_batch_size,
            "plan": self.speed_plan.record(),
            "precision": {
                "bf16": args.bf16,
                "fp16": args.fp16,
                "tf32": args.tf32,
                "autocast": str(self.accelerator.mixed_precision),
            },
            "device": reuse.device_facts(args.device),
            "code": reuse.code_digest(type(self)),
            "libraries": reuse.environment(),
        }

    def _score_ref(self, dataset: Dataset, rows: list[int], name: str) -> Dataset:
        """`rows`' reference log-probs (NaN elsewhere), in dataset order, under a progress bar with an ETA.
        Train rows are scored in order of length, so a batch pads to nearly its own length. Eval rows are
        scored in the eval loader's own batches (dataset order): a row's log-prob moves in the last bits
        with its batch-mates' padding, and in these batches the eval at step 0 computes the policy's
        bitwise the same, so its rewards are exact ties (margins 0, accuracy 0), as in TRL's precompute."""
        was_training = self.model.training
        self.model.eval()
        order = list(rows)
        if name == "train":
            lengths = {
                i: len(p) + max(len(c), len(r))
                for i, p, c, r in zip(
                    rows, *(dataset.select(rows)[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids"))
                )
            }
            order.sort(key=lengths.__getitem__)
        chosen, rejected = [float("nan")] * len(dataset), [float("nan")] * len(dataset)
        bs = self.args.per_device_eval_batch_size
        if self.is_local_process_zero():
            logger.info(
                "reference log-probs (the initial policy): scoring %d of %d %s pairs%s",
                len(rows),
                len(dataset),
                name,
                "" if len(rows) == len(dataset) else " (the ones this run draws)",
            )
        with tqdm(
            total=len(order),
            desc=f"Reference log-probs ({name} pairs)",
            unit="pair",
            leave=False,
            disable=not self.is_local_process_zero() or self.args.disable_tqdm,
        ) as bar:  # closed on a failure too
            for start in range(0, len(order), bs):
                idx = order[start : start + bs]
                batch = self._prepare_inputs(self.data_collator([dataset[i] for i in idx]))
                # accelerate's autocast, as TRL's precompute: the training forwards get it from accelerate's
                # wrapper of model.forward, which does not exist yet (Trainer's own autocast context is a
                # no-op)
                with self.accelerator.autocast():
                    logps = self._reference_logps(self.model, batch)
                c, r = logps.float().chunk(2)
                for i, lc, lr in zip(idx, c.tolist(), r.tolist()):
                    chosen[i], rejected[i] = lc, lr
                bar.update(len(idx))
        self.model.train(was_training)
        return Dataset.from_dict({"ref_chosen_logps": chosen, "ref_rejected_logps": rejected})

    def _rows_used(self, dataset: Dataset) -> list[int] | None:
        """The train rows this run draws, from step 0 to max_steps (sorted), or None for all of them.

        Read from the train dataloader Trainer itself builds: with a seeded sampler (accelerate's
        SeedableRandomSampler, seeded by data_seed) its first epoch's order is fixed, so walking its
        batch sampler here yields exactly the batches train() will draw, without touching any RNG. A
        resumed launch computes the same rows (all of the run's, not only those after the resume), so
        each row's reference log-prob is the same number in every launch. A run of a whole epoch or
        more, or an unseeded or unknown sampler, scores every row."""
        from accelerate.data_loader import SeedableRandomSampler
        from torch.utils.data import SequentialSampler

        # micro-batches this process draws, plus the one accelerate's loader collates ahead of the last
        needed = self.args.max_steps * self.args.gradient_accumulation_steps + 1
        if self.args.max_steps <= 0 or needed >= len(dataset):
            return None
        loader = self.get_train_dataloader()
        batches = getattr(loader, "batch_sampler", None)
        # BatchSamplerShard wraps the batch sampler under DDP
        inner = getattr(batches, "batch_sampler", batches)
        if needed >= len(loader) or not isinstance(
            getattr(inner, "sampler", None), (SeedableRandomSampler, SequentialSampler)
        ):
            return None
        used: set[int] = set()
        for n, batch in enumerate(batches):
            if n >= needed:
                break
            used.update(int(i) for i in batch)
        return sorted(used)

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mode = "train" if model.training else "eval"
        if self.initial_forwards is not None and mode == "eval" and not return_outputs:
            logps, out = self.initial_forwards(inputs, lambda: self._sequence_logps(model, inputs))
        else:
            logps, out = self._sequence_logps(model, inputs, need_logits=return_outputs)
        logp_c, logp_r = logps.chunk(2)  # the batch is [chosen; rejected]
        if self.reference_free:  # the loss reads none
            ref_c, ref_r = torch.zeros_like(logp_c), torch.zeros_like(logp_r)
        elif "ref_chosen_logps" in inputs:  # precomputed
            ref_c, ref_r = inputs["ref_chosen_logps"], inputs["ref_rejected_logps"]
        else:
            ref_c, ref_r = self._reference_logps(model, inputs).chunk(2)
        ref_c, ref_r = ref_c.to(logp_c), ref_r.to(logp_r)
        n_c, n_r = inputs["completion_mask"].sum(-1).to(logp_c).chunk(2)  # completion tokens per sequence
        extra = {}
        if self.scores_prompt:  # the chosen rows' prompt tokens
            extra = {
                "prompt_c": out["prompt_logps"].chunk(2)[0],
                "prompt_n_c": out["prompt_n"].to(logp_c).chunk(2)[0],
            }
        result = self.loss_fn(logp_c, logp_r, ref_c, ref_r, n_c, n_r, beta=self.args.beta, **extra)
        # a loss of the user's returning another thing: one line
        losses, metrics = _loss_result(self.loss_fn, result)
        metrics = {**dpo_losses.reward_metrics(logp_c, logp_r, ref_c, ref_r, self.args.beta), **metrics}
        self.metrics.add(mode, {k: self.accelerator.gather_for_metrics(v) for k, v in metrics.items()})
        self.metrics.add(mode, completion_token_metrics(out["stats"], out["seq"], len(logp_c)))
        if mode == "train":  # TRL's num_tokens: prompt + completion tokens trained on so far
            # a device tensor, read with the log (MetricsBuffer): an int() here would wait for the device
            self.num_tokens = (
                self.num_tokens + self.accelerator.gather_for_metrics(inputs["attention_mask"].sum()).sum()
            )
        self.metrics.set(mode, "num_tokens", self.num_tokens)
        loss = losses.mean()
        return (loss, {"logits": out["logits"]}) if return_outputs else loss

    def evaluate(
        self,
        eval_dataset: Dataset | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> dict[str, float]:
        """Trainer's evaluate; at step 0 with the cache on, the initial policy's forwards come from the
        cache's `initial_eval` entry (recorded by the first job that ran them:
        ablate.methods.initial_eval)."""
        if not self._initial_eval_reusable(eval_dataset):
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        what = f"the initial policy's forwards of {len(self.eval_dataset)} eval pairs"
        with self.cache.slot("initial_eval", what, self._initial_eval_key) as slot:
            self.initial_forwards = initial_eval.Forwards(slot.found)
            try:
                out = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
            finally:
                forwards, self.initial_forwards = self.initial_forwards, None
            if slot.found is None:
                slot.store(forwards.dataset())
        return out

    def _initial_eval_key(self) -> dict[str, Any]:
        """The eval rows' reference key (the same forwards, batched as the eval batches them) and how the
        eval loader groups them."""
        return {
            **self._ref_key(self.eval_dataset, list(range(len(self.eval_dataset)))),
            "drop_last": self.args.dataloader_drop_last,
            "collator": type(self.data_collator).__qualname__,
        }

    def _initial_eval_reusable(self, eval_dataset: Dataset | None) -> bool:
        """An eval whose forwards every job of a sweep runs alike: the initial weights (step 0 of a fresh
        run), the run's own eval set, one process, no logits wanted (no compute_metrics), and the speed
        plan's per-token statistics (the plain path's full logits are not worth storing)."""
        return (
            self.cache.enabled
            and self.state.global_step == 0
            and eval_dataset is None
            and isinstance(self.eval_dataset, Dataset)
            and self.args.world_size == 1
            and self.compute_metrics is None
            and self.speed_plan.any_on("dpo_pair_rows", "padding_free", "completion_only_logits")
        )

    def prediction_step(
        self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool, ignore_keys: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Eval batches have no `labels`; run `compute_loss` so eval reports the DPO loss and metrics.

        With a `compute_metrics` hook it receives the logits of `[chosen; rejected]` and, as labels,
        `input_ids` with every non-completion position set to -100 (the SFT convention).
        """
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            if prediction_loss_only:  # no logits wanted: the fast path
                return self.compute_loss(model, inputs).detach(), None, None
            loss, outputs = self.compute_loss(model, inputs, return_outputs=True)
        labels = inputs["input_ids"].masked_fill(inputs["completion_mask"] == 0, -100)
        return loss.detach(), outputs["logits"], labels


def longest_row(args: DPOConfig) -> int | None:
    """The longest row of TRL's layout (prompt + one completion) the data can give: a sliding window at
    least this long never cuts one (ablate.speed.plan); None when nothing caps it."""
    if args.max_length is not None:
        return args.max_length
    if args.max_prompt_length is not None and args.max_completion_length is not None:
        return args.max_prompt_length + args.max_completion_length
    return None
