"""Fast GRPO generation: each prompt's KV cache is computed once and shared by its group, and rows
that have ended leave the batch.

A generation round samples `num_generations` completions per prompt. `HFGenerator` hands all of them
to `model.generate`, which (1) runs each prompt through the model once per completion and (2) keeps
computing every row until the longest completion ends (finished rows emit padding). On CPU both cost
compute: a 16-row decode step of a 135M model is ~4 GFLOP, so a row that ended at token 7 of 64 still
costs 57 rows-steps. `SharedPromptGenerator` prefills each *distinct* prompt once (left-padded to the
batch's width and with generate's position ids, so the cache holds what generate's prefill holds),
copies that cache along the batch to every row with that prompt, and drops a row from the batch (and
its cache) as soon as it emits a stop id.

Sampling is transformers' own arithmetic, step for step: the same logits warpers (temperature, top_k,
top_p, in generate's order), softmax in fp32, and the draw `torch.multinomial` makes for one sample
(`argmax(probs / q)`, `q ~ Exp(1)` drawn for the whole (rows, vocab) batch, ended rows included, so the
RNG advances exactly as in generate and the runs stay in step). Ending rows, the last step, and the
stop ids are generate's too. So with the same seed it draws the same completions as `HFGenerator`
whenever its logits are bitwise generate's; they are on the tiny model and SmolLM2-135M on CPU in the
tests, but a matmul kernel may sum in another order for another number of rows, which can flip a
near-tie draw. The contract is therefore: greedy identical, sampling equal in distribution (and equal
draw for draw where the logits are).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import DynamicCache, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ablate.losses.logps import selective_log_softmax


class SamplingArgs(Protocol):
    """What a generator reads from the method's arguments (GRPOConfig has these fields)."""

    temperature: float
    top_p: float
    top_k: int
    max_completion_length: int


class SharedPromptGenerator:
    """A `GenerateFn` (the `generator=` seam of `GRPOTrainer`): one prefill per distinct prompt, ended
    rows leave the batch; sampling as `HFGenerator`'s `model.generate` (see the module docstring):
    the config's temperature, top_k (0 = off) and top_p.

    `do_sample=False` decodes greedily (tests, evaluation). Models whose forward takes no `cache=`
    (transformers' causal LMs all do) should use `HFGenerator`.
    """

    def __init__(
        self, args: SamplingArgs, tokenizer: PreTrainedTokenizerBase, do_sample: bool = True
    ) -> None:
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id
        self.max_new_tokens = args.max_completion_length
        self.temperature = args.temperature  # the log-probs' temperature, as the trainer's (sampling or not)
        self.do_sample = do_sample
        warpers = []  # generate's order (GenerationMixin._get_logits_processor)
        if do_sample and args.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(args.temperature))
        if do_sample and args.top_k:
            warpers.append(TopKLogitsWarper(top_k=args.top_k))
        if do_sample and args.top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=args.top_p))
        self.warpers = LogitsProcessorList(warpers)

    def __call__(self, model: PreTrainedModel, prompt_ids: list[list[int]]) -> list[list[int]]:
        return self.sample(model, prompt_ids).ids

    @torch.no_grad()
    def sample(
        self, model: PreTrainedModel, prompt_ids: list[list[int]], policy_logps: bool = False
    ) -> Completions:
        """The completions and, with `policy_logps`, each sampled token's log-prob under `model` at the
        sampling temperature, taken from the very logits it was drawn from (no second forward pass)."""
        stops = stop_ids(self.tokenizer, model)
        device = next(model.parameters()).device
        input_ids, mask = (t.to(device) for t in left_pad(prompt_ids, self.pad_id))
        was_training = model.training
        model.eval()
        try:
            out, logps = self._decode(
                model, prompt_ids, input_ids, mask, torch.tensor(stops, device=device), policy_logps
            )
        finally:
            model.train(was_training)
        ids = [cut_at_eos(row, stops) for row in out.tolist()]
        if logps is None:
            return Completions(ids=ids)
        return Completions(ids=ids, policy_logps=[row[: len(c)] for row, c in zip(logps.tolist(), ids)])

    def _decode(
        self,
        model: PreTrainedModel,
        prompt_ids: list[list[int]],
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        stops: torch.Tensor,
        policy_logps: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        rows = input_ids.size(0)
        first: dict[tuple[int, ...], int] = {}  # distinct prompt -> its first row
        for i, p in enumerate(prompt_ids):
            first.setdefault(tuple(p), i)
        slot = {key: j for j, key in enumerate(first)}
        expand = torch.tensor([slot[tuple(p)] for p in prompt_ids], device=input_ids.device)
        unique = torch.tensor(list(first.values()), device=input_ids.device)
        position_ids = mask.long().cumsum(-1) - 1  # as generate: padding at position 1
        position_ids.masked_fill_(mask == 0, 1)
        cache = DynamicCache(config=model.config)
        logits = model(
            input_ids=input_ids[unique],
            attention_mask=mask[unique],
            position_ids=position_ids[unique],
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        if len(first) < rows:
            cache.reorder_cache(expand)  # one copy of each prompt's keys/values per row that has it
        logits = logits[expand]
        out = torch.full((rows, self.max_new_tokens), self.pad_id, dtype=torch.long, device=input_ids.device)
        logps = torch.zeros(rows, self.max_new_tokens, device=input_ids.device) if policy_logps else None
        active = torch.arange(rows, device=input_ids.device)  # batch row -> output row
        no_ids = input_ids[:, :0]  # the warpers above read only the scores
        for step in range(self.max_new_tokens):
            scores = self.warpers(no_ids, logits.to(dtype=torch.float32))
            if self.do_sample:
                probs = torch.softmax(scores, dim=-1)
                # torch.multinomial(probs, 1) is argmax(probs / q), q ~ Exp(1) over the whole tensor: draw q
                # for every row generate would still carry, so the RNG stream (and later draws) match
                # generate's
                q = torch.empty((rows, probs.size(-1)), dtype=probs.dtype, device=probs.device).exponential_(
                    1
                )
                tokens = (probs / q[active]).argmax(dim=-1)
            else:
                tokens = scores.argmax(dim=-1)
            out[active, step] = tokens
            # as the trainer scores a completion: logits / temperature, log-softmax in fp32
            if logps is not None:
                # (bf16 logits too)
                logps[active, step] = selective_log_softmax(logits.float() / self.temperature, tokens)
            going = ~torch.isin(tokens, stops)
            if step == self.max_new_tokens - 1 or not going.any():
                break
            if not going.all():  # ended rows leave the batch and the cache
                keep = going.nonzero().squeeze(1)
                cache.reorder_cache(keep)
                active, mask, tokens = active[keep], mask[keep], tokens[keep]
            mask = torch.cat([mask, mask.new_ones(mask.size(0), 1)], dim=1)
            logits = model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=mask.sum(-1, keepdim=True) - 1,
                cache=cache,
                use_cache=True,
            ).logits[:, -1]
        return out, logps


@dataclass
class Completions:
    """What a generator may return instead of plain ids: the completions and, from an engine that samples
    with numbers of its own (vLLM), its log-prob of each sampled token (after its temperature, top-k and
    top-p processing), for the trainer's importance-sampling correction (ablate.losses.is_correction)."""

    ids: list[list[int]]  # one completion per prompt row, each cut after its EOS
    logps: list[list[float]] | None = None  # the engine's log-prob of each token of `ids`; None: none given
    # the sampling model's log-prob of each token of `ids` as the loss defines it (temperature only, no
    # top-k/top-p), from the logits it was sampled from: pi_old for asynchronous GRPO's worker
    # (SharedPromptGenerator.sample)
    policy_logps: list[list[float]] | None = None
    # rollouts with tool calls (ablate.rollouts.turns): per id, 1 if the model wrote it, 0 for a tool result
    tool_mask: list[list[int]] | None = None
    messages: list[list[dict]] | None = (
        None  # each completion as messages (turns and tool results), for the rewards
    )
    tool_calls: list[int] | None = None  # calls each rollout made
    tool_failures: list[int] | None = None  # of which failed (an error, a timeout, an unknown tool)
    tool_truncated: list[int] | None = None  # results cut to method.args.max_tool_result_length


# The generation seam: (model, prompt ids) -> completion ids, each cut after its EOS, or `Completions`
# (ids + the engine's per-token log-probs)
GenerateFn = Callable[[PreTrainedModel, list[list[int]]], "list[list[int]] | Completions"]


def as_completions(out: list[list[int]] | Completions) -> Completions:
    """A generator's return value as `Completions` (plain ids: no engine log-probs)."""
    return out if isinstance(out, Completions) else Completions(ids=out)


class HFGenerator:
    """Sampling with `model.generate`: prompts left-padded, completions cut after the first EOS.

    EOS is every id in `stop_ids`: the tokenizer's EOS and the model's `generation_config.eos_token_id`
    (a chat model ends its turn with the template's end-of-turn token, e.g. <|im_end|>, which some
    tokenizers do not call EOS). The default generation backend; a faster engine only has to be a
    `GenerateFn`. Draws from torch's global RNG, which Trainer seeds (and restores on resume), so runs
    are deterministic on CPU.
    """

    def __init__(self, args: SamplingArgs, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id
        self.config = GenerationConfig(
            do_sample=True,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_new_tokens=args.max_completion_length,
            pad_token_id=self.pad_id,
        )

    @torch.no_grad()
    def __call__(self, model: PreTrainedModel, prompt_ids: list[list[int]]) -> list[list[int]]:
        stops = stop_ids(self.tokenizer, model)
        self.config.eos_token_id = stops
        input_ids, attention_mask = left_pad(prompt_ids, self.pad_id)
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        try:
            out = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                generation_config=self.config,
            )
        finally:
            model.train(was_training)
        return [cut_at_eos(row, stops) for row in out[:, input_ids.size(1) :].tolist()]


def build_generator(
    generator: GenerateFn | Callable[..., GenerateFn] | None,
    args: SamplingArgs,
    tokenizer: PreTrainedTokenizerBase,
    longest_row: int | None = None,
) -> GenerateFn:
    """The trainer's `generator=`: None -> `SharedPromptGenerator` (the default); a class, or a partial of
    one (a `method/rollouts=NAME` config: `{_target_: ..., _partial_: true}`) -> built with
    (args, tokenizer); anything else is already a `GenerateFn`. An engine that sizes itself by the longest
    row (prompt + completion) the data holds (vLLM's max_model_len) is told it: `fit_rows(longest_row)`."""
    if generator is None:
        return SharedPromptGenerator(args, tokenizer)
    if isinstance(generator, type) or (
        isinstance(generator, functools.partial) and isinstance(generator.func, type)
    ):
        generator = generator(args, tokenizer)
    fit = getattr(generator, "fit_rows", None)
    if callable(fit) and longest_row is not None:
        fit(longest_row)
    return generator


def stop_ids(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None = None) -> list[int]:
    """Ids that end a completion: the tokenizer's EOS, then any other EOS of the model's generation config."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for i in extra if isinstance(extra, (list, tuple)) else [extra] if extra is not None else []:
        if i not in ids:
            ids.append(int(i))
    return ids


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad so every prompt ends where generation starts. Returns (ids, mask)."""
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[pad_id] * (width - len(s)) + s for s in seqs], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], dtype=torch.long)
    return ids, mask


def cut_at_eos(ids: list[int], eos_id: int | list[int]) -> list[int]:
    """Keep tokens up to and including the first EOS, any of `eos_id` (what follows is padding)."""
    stops = {eos_id} if isinstance(eos_id, int) else set(eos_id)
    end = next((i for i, t in enumerate(ids) if t in stops), None)
    return ids if end is None else ids[: end + 1]


def right_pad(
    seqs: list[list[int]] | list[list[float]], pad_id: int | float, dtype: torch.dtype = torch.long
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad completions (or their per-token values, `dtype`) to (B, max(len, 1)): (values, mask)."""
    width = max(max(len(s) for s in seqs), 1)
    ids = torch.tensor([list(s) + [pad_id] * (width - len(s)) for s in seqs], dtype=dtype)
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], dtype=torch.long)
    return ids, mask
