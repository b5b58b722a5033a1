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

from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

if TYPE_CHECKING:
    from ablate.trainers.grpo import GRPOConfig


class SharedPromptGenerator:
    """A `GenerateFn` (the `generator=` seam of `GRPOTrainer`): one prefill per distinct prompt, ended
    rows leave the batch; sampling as `HFGenerator`'s `model.generate` (see the module docstring):
    the config's temperature, top_k (0 = off) and top_p.

    `do_sample=False` decodes greedily (tests, evaluation). Models whose forward takes no `cache=`
    (transformers' causal LMs all do) should use `HFGenerator`.
    """

    def __init__(self, args: "GRPOConfig", tokenizer: PreTrainedTokenizerBase, do_sample: bool = True) -> None:
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id
        self.max_new_tokens = args.max_completion_length
        self.do_sample = do_sample
        warpers = []  # generate's order (GenerationMixin._get_logits_processor)
        if do_sample and args.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(args.temperature))
        if do_sample and args.top_k:
            warpers.append(TopKLogitsWarper(top_k=args.top_k))
        if do_sample and args.top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=args.top_p))
        self.warpers = LogitsProcessorList(warpers)

    @torch.no_grad()
    def __call__(self, model: PreTrainedModel, prompt_ids: list[list[int]]) -> list[list[int]]:
        from ablate.trainers.grpo import cut_at_eos, left_pad, stop_ids

        stops = stop_ids(self.tokenizer, model)
        device = next(model.parameters()).device
        input_ids, mask = (t.to(device) for t in left_pad(prompt_ids, self.pad_id))
        was_training = model.training
        model.eval()
        try:
            out = self._decode(model, prompt_ids, input_ids, mask, torch.tensor(stops, device=device))
        finally:
            model.train(was_training)
        return [cut_at_eos(row, stops) for row in out.tolist()]

    def _decode(self, model: PreTrainedModel, prompt_ids: list[list[int]], input_ids: torch.Tensor,
                mask: torch.Tensor, stops: torch.Tensor) -> torch.Tensor:
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
        logits = model(input_ids=input_ids[unique], attention_mask=mask[unique], position_ids=position_ids[unique],
                       cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        if len(first) < rows:
            cache.reorder_cache(expand)  # one copy of each prompt's keys/values per row that has it
        logits = logits[expand]
        out = torch.full((rows, self.max_new_tokens), self.pad_id, dtype=torch.long, device=input_ids.device)
        active = torch.arange(rows, device=input_ids.device)  # batch row -> output row
        no_ids = input_ids[:, :0]  # the warpers above read only the scores
        for step in range(self.max_new_tokens):
            scores = self.warpers(no_ids, logits.to(dtype=torch.float32))
            if self.do_sample:
                probs = torch.softmax(scores, dim=-1)
                # torch.multinomial(probs, 1) is argmax(probs / q), q ~ Exp(1) over the whole tensor: draw q for
                # every row generate would still carry, so the RNG stream (and later draws) match generate's
                q = torch.empty((rows, probs.size(-1)), dtype=probs.dtype, device=probs.device).exponential_(1)
                tokens = (probs / q[active]).argmax(dim=-1)
            else:
                tokens = scores.argmax(dim=-1)
            out[active, step] = tokens
            going = ~torch.isin(tokens, stops)
            if step == self.max_new_tokens - 1 or not going.any():
                break
            if not going.all():  # ended rows leave the batch and the cache
                keep = going.nonzero().squeeze(1)
                cache.reorder_cache(keep)
                active, mask, tokens = active[keep], mask[keep], tokens[keep]
            mask = torch.cat([mask, mask.new_ones(mask.size(0), 1)], dim=1)
            logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=mask.sum(-1, keepdim=True) - 1,
                           cache=cache, use_cache=True).logits[:, -1]
        return out
