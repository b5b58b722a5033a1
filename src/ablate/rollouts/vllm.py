"""A vLLM engine in the training process behind GRPO's generator seam (`method/rollouts=vllm`,
conf/method/rollouts/vllm.yaml), as TRL's `vllm_mode="colocate"`. What every engine shares (sampling, per-row
seeds, when the weights are pushed): ablate.rollouts.engine.

One engine per process: in a single process VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps it in the trainer's
process; under torchrun (DDP or FSDP2) each rank holds an engine of its own, built on vLLM's
`external_launcher` executor over the trainer's process group (the ranks' engines are independent
data-parallel replicas: each samples its own rank's prompts, as verl's and TRL's colocated engines do). It is
built on the first generation round from the policy's directory on disk and freed when training ends, however
it ends (`RolloutTrainer.train` calls `close()` in a `finally`). Its memory is bounded by config:
`kv_cache_gib` (vLLM's kv_cache_memory_bytes; on a CPU the only bound, which VLLM_CPU_KVCACHE_SPACE would
otherwise set), else `gpu_memory_utilization`, and `max_model_len` (default: the longest row a round holds,
the data's longest prompt, or max_prompt_length, + max_completion_length: the trainer says it, `fit_rows`).

Weights: pushed before every generation round that follows an optimizer step (and before the first: the engine
loaded the checkpoint on disk, which a resume or adapters have since changed), streamed by
ablate.rollouts.weights (LoRA merged; FSDP2 one unit gathered at a time, never the whole model on a rank
beyond the engine's own copy). The push is TRL's colocated one on a GPU (`model.load_weights`). vLLM's CPU
backend re-packs its linear weights into its own kernel layout after loading (they lose `weight_loader`), so
there the push is vLLM's in-place `reload_weights`, and a tied LM head (SmolLM2) is re-tied and re-packed,
which that reload skips. The prefix cache is reset after every push (it holds keys and values of the old
weights). A 4-bit (QLoRA) base has no full-precision weights to push and is refused.

RNG: vLLM reseeds Python's, NumPy's and torch's global RNGs when it builds its engine, and its CPU sampler
draws from torch's at every decode step whatever the request's seed; their states are put back after both: a
round moves the trainer's random streams (dropout, sampling order) by one draw only.
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
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ablate.errors import ConfigError, missing_extra
from ablate.models.adapters import is_adapted
from ablate.rollouts.engine import EngineGenerator, world_size
from ablate.rollouts.generation import SamplingArgs
from ablate.rollouts.weights import Digest, policy_weights
from ablate.schema.nodes import VLLM

log = logging.getLogger("ablate")


class VLLMGenerator(EngineGenerator):
    """A `GenerateFn` returning `Completions` with the engine's per-token log-probs (module docstring)."""

    on_trainer_gpus = True  # the engine shares the training GPUs (ablate plan counts it there)

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
        seed: int = 0,  # the config's ${seed}
        verify_push: bool = VLLM.verify_push,
    ) -> None:
        super().__init__(args, tokenizer, verify_push)
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
        self._trainer_group = False  # torch.distributed was the trainer's before the engine was built
        self.max_model_len = max_model_len  # method.rollouts.max_model_len: the user's, kept over fit_rows
        self._tmp: str | None = None

    def fit_rows(self, longest_row: int) -> None:
        """The longest prompt + completion the trainer's data holds: the engine's max_model_len, unless
        method.rollouts.max_model_len is set (vLLM's default, the model's context, may not fit the KV
        cache)."""
        if self.max_model_len is None:
            self.engine_args["max_model_len"] = longest_row

    # ---- the engine (ablate.rollouts.engine.EngineGenerator) ----

    def start(self, model: PreTrainedModel) -> None:
        """The engine, built on first use from the policy's base model directory."""
        if self.llm is None:
            self.llm = self._build(model)

    def sample(
        self, prompt_ids: list[list[int]], seeds: list[int], stops: list[int]
    ) -> list[tuple[list[int], list[float]]]:
        from vllm import SamplingParams, TokensPrompt

        params = [SamplingParams(n=1, seed=seed, detokenize=False, **self.sampling(stops)) for seed in seeds]
        with _global_rng_kept():  # vLLM's CPU sampler also draws from torch's global RNG at every decode step
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params, use_tqdm=False
            )
        out = []
        for o in outputs:
            c = o.outputs[0]
            out.append((list(c.token_ids), [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]))
        return out

    def push(self, model: PreTrainedModel) -> None:
        from vllm.platforms import current_platform

        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        received = Digest()  # what the engine loads, hashed as it consumes it (method.rollouts.verify_push)
        weights = received.passing(policy_weights(model)) if self.verify_push else policy_weights(model)
        if current_platform.is_cpu():  # packed CPU kernels: vLLM's in-place reload, then the tied head
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
            )
            retie_head(runner.model)
        else:  # TRL's colocated push
            runner.model.load_weights(weights)
        self.llm.reset_prefix_cache()
        self._received = received.hexdigest()

    def received_digests(self) -> list[str]:
        return [self._received]

    def close(self) -> None:
        """Shut the engine down and free its memory (weights, KV cache, vLLM's process group)."""
        llm, self.llm, self.pushed = self.llm, None, None
        if llm is not None:
            try:
                with _default_group_kept(self._trainer_group):  # the trainer's process group: still in use
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
        base = model.get_base_model() if is_adapted(model) else model
        if getattr(base.config, "quantization_config", None) is not None:
            raise ConfigError(
                "method/rollouts=vllm cannot take a quantized (QLoRA) base: the push needs "
                "full-precision weights; use +peft=lora"
            )
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process (colocated)
        # under torchrun: an engine per rank over the trainer's process group (independent replicas)
        launcher = {"distributed_executor_backend": "external_launcher"} if world_size() > 1 else {}
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        try:
            from vllm import LLM
        except ImportError:
            raise missing_extra("vllm", "vllm", "method/rollouts=vllm") from None
        source, load = self._source(base)
        self._trainer_group = torch.distributed.is_available() and torch.distributed.is_initialized()
        t0 = time.perf_counter()
        with _global_rng_kept():  # vLLM seeds the global RNGs in-process: keep the trainer's streams
            # ids in, ids out: a tokenizer only where the directory has one (a config-only one has none)
            llm = LLM(
                model=source,
                load_format=load,
                skip_tokenizer_init=load == "dummy",
                logprobs_mode="processed_logprobs",
                **launcher,
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


@contextlib.contextmanager
def _default_group_kept(keep: bool) -> Iterator[None]:
    """vLLM's engine shutdown ends with `torch.distributed.destroy_process_group()`: right for the group it
    made itself, wrong for the trainer's (torchrun: external_launcher, or a 1-rank group), which the trainer
    still needs (FSDP2 gathers the model to save it). With `keep` vLLM's own groups go, the default stays."""
    dist = torch.distributed
    if not keep:
        yield
        return
    destroy = dist.destroy_process_group

    def keep_default(group: Any = None) -> None:
        if group is not None:
            destroy(group)

    dist.destroy_process_group = keep_default
    try:
        yield
    finally:
        dist.destroy_process_group = destroy


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


def retie_head(model: Any) -> None:
    """A tied LM head (SmolLM2) after vLLM's CPU reload: tied to the embedding again and re-packed for the CPU
    kernels (the reload skips a weight the checkpoint does not hold)."""
    if getattr(model.config, "tie_word_embeddings", False):
        model.lm_head.weight = model.model.embed_tokens.weight
        model.lm_head.quant_method.process_weights_after_loading(model.lm_head)
