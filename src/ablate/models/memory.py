"""The memory plan's arithmetic (`ablate plan`): bytes per GPU of a training run, from what the model is
(`Shape`: counted from the model built on the meta device) and how it trains (`Setup`: the composed
config's method, precision, PEFT, optimizer, batch, gradient checkpointing and sharding). No torch here:
every number is a product of counts and bytes, checked by hand in tests/unit/test_memory_plan.py.

What each part counts, per GPU:
- parameters: every weight at its dtype's bytes (QLoRA: the decoder's Linear weights at 4.13 bits, NF4
  with double-quantized constants); under FSDP 1/N of them, plus two gathered decoder layers (the one
  running and the one prefetched).
- gradients: one per trainable parameter (LoRA: the adapters only, kept in fp32 by peft); DDP adds its
  bucket copy on 2+ GPUs; FSDP 1/N of them plus one layer's unsharded gradient before its reduce-scatter.
- optimizer: AdamW's two moments at the parameter's dtype (8-bit AdamW: 2 bytes; SGD with momentum: one
  copy), 1/N under FSDP.
- reference: a frozen copy of the weights when the method scores a reference model every step (DPO/KTO
  without precomputed log-probs, GRPO/RLOO with beta > 0) and it is not the policy itself with its
  adapters off (LoRA); distill's teacher.
- activations: what one micro-batch's forward keeps for the backward, per token and decoder layer
  10h + 4i + 4kv values (the saved inputs of the norms, projections, attention and SwiGLU MLP) at the
  compute dtype, plus LoRA's dropout copies; with gradient checkpointing only each layer's input plus
  one layer recomputed; with activation offload too (transformers' `gradient_checkpointing_kwargs={offload:
  true}`: the checkpointed inputs in pinned host memory) one layer's only.
  Sequence parallelism (N ranks a sequence, ablate.speed.ulysses) divides the decoder's tokens by N and
  adds the all-to-all buffers of one layer's q, k, v; with the chunked head each rank projects its own
  positions, otherwise the final hidden states are gathered (the whole sequence on every rank, and the
  copy the head keeps) and every position projected on every rank. The LM head: the full logits in fp32
  (logits, log-softmax and their gradients: 3 vocab-wide fp32 rows a token, plus the compute-dtype
  logits), or with the chunked head (ablate.speed.head: SFT's, DPO's and GRPO's `completion_only_logits`) one
  chunk of rows of them, whatever the length. bf16/fp16 autocast over fp32 weights also keeps a
  half-precision copy of each weight it multiplies. Attention is a flash/memory-efficient kernel's: no
  [tokens, tokens] scores.
- step: the optimizer step's temporaries, beside the gradients: none for a fused AdamW (one kernel over
  each tensor: TRL's and transformers' default `adamw_torch_fused`); a foreach AdamW's (torch.optim.AdamW's
  own default on a GPU) `_foreach_sqrt` of the second moments, a copy of every trainable tensor; a
  single-tensor AdamW's (its default on a CPU, where torch has no foreach kernels) the square root and the
  denominator of the largest tensor (the embedding or the LM head), plus the previous tensor's
  denominator (counted as one MLP matrix, the largest of a decoder layer).
  Measured with live tensor bytes over AdamW.step on a CPU: 0, 1.00x and 2 x largest + previous.
- total: parameters + optimizer + reference + the larger of activations and gradients with the step's
  temporaries (the backward frees a layer's activations as it makes its gradients; the gradients were freed
  before the forward).

On a CPU (`device="cpu"`) the plan is the process's resident memory (peak RSS), not a GPU's: the head's
chunk is the CPU's (ablate.losses.logps.LOGITS_CHUNK_ELEMENTS), and the total adds
- runtime: the libraries' resident memory before any tensor exists (torch, transformers, TRL: ~520 MB), read
  by the caller from a process that has imported them;
- heap: what glibc keeps. torch's CPU tensors come from malloc, whose mmap threshold rises to the size of
  each mmapped block freed (up to 32 MiB), so after the first step nearly every activation lives on the
  heap, and the heap keeps its freed blocks resident for reuse (ablate.process.memory): the blocks the
  backward frees stay resident beside the gradients, so the heap holds the activations and the gradients
  at once (their sum, where a GPU's allocator holds the larger). `malloc_mmap_threshold` fixes the
  threshold (`heap_keeps_activations=False`): blocks above it are mmapped and given back when freed, and
  the larger of the two counts again. Measured (SmolLM2-135M DPO, one pair a step, fp32, checkpointing,
  docs/plan.md): at 256 tokens a side the default malloc's peak RSS exceeds the fixed threshold's by
  246 MB, against the plan's activations of 330 MB (its head chunk counts every position, the run projects
  the completions' only); with the threshold fixed, peak RSS is the libraries plus the live tensors' peak
  within 5%. Not counted: later steps' fragmentation on the default malloc (their
  activations do not reuse every block the first step freed around the optimizer's state), which leaves
  the plan at 0.8x of the peak at 1024-2048 tokens a side.
"""

from __future__ import annotations

import dataclasses

GB = 1e9
# logits elements in one chunk of the LM head, per device type (ablate.losses.logps.LOGITS_CHUNK_ELEMENTS,
# which imports torch; tests/unit/test_memory_plan.py keeps the two equal)
HEAD_CHUNK = {"cpu": 1 << 24, "cuda": 1 << 26}
QLORA_BYTES = 4.127 / 8  # NF4 weight + its double-quantized absmax per 64-element block


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the arithmetic needs of a model (ablate.cli.plan counts it from the meta-device model)."""

    params: int  # every parameter
    linear_params: int  # the decoder layers' Linear weights (quantized by QLoRA; what autocast casts)
    layer_params: int  # one decoder layer's parameters (FSDP gathers one layer at a time)
    adapter_params: int  # LoRA's A and B (0 without PEFT)
    layers: int  # decoder layers
    hidden: int  # hidden size h
    intermediate: int  # MLP width i
    kv_dim: int  # key/value heads x head dim
    vocab: int  # LM head rows
    head_params: int  # the LM head's weight (tied or not): vocab x hidden


@dataclasses.dataclass(frozen=True)
class Setup:
    """How the model trains (ablate.cli.plan reads it from the composed config)."""

    weight_bytes: int  # bytes per weight of model.dtype: 4 float32, 2 bfloat16/float16
    autocast: bool  # precision=bf16|fp16 (half-precision compute over the weights)
    peft: str | None  # None | "lora" | "qlora"
    optimizer_states: float  # optimizer state per trainable parameter, in parameter-dtype copies (AdamW: 2)
    # bytes per trainable parameter when they do not follow its dtype (8-bit: 2)
    optimizer_fixed_bytes: float | None
    reference: bool  # a frozen copy of the weights in memory
    sequences: int  # sequences in one micro-batch (DPO: 2 x pairs)
    seq_len: int  # tokens per sequence
    checkpointing: bool  # gradient checkpointing
    gpus: int  # GPUs the run spans
    sharded: bool  # FSDP full shard (else each GPU holds everything, DDP)
    sequence_parallel: int = 1  # ranks that split each sequence (distributed.sequence_parallel)
    chunked_head: bool = False  # the LM head projects a chunk of rows at a time (no [tokens, vocab] logits)
    offload: bool = False  # activation offload: checkpointed layers' inputs in host memory (a GPU's)
    head_chunk: int | None = None  # logits elements a chunk (None: the device's, HEAD_CHUNK)
    optimizer_step: str = "fused"  # AdamW's step: fused | foreach | single (its temporaries: step)
    device: str = "cuda"  # "cuda": bytes of one GPU's memory; "cpu": the process's resident memory
    runtime_bytes: float = 0.0  # cpu: the libraries' resident memory before any tensor (read by the caller)
    heap_keeps_activations: bool = True  # cpu: glibc's default malloc (False: malloc_mmap_threshold set)


def plan(m: Shape, s: Setup) -> dict[str, float]:
    """Bytes per GPU of each part (parameters, gradients, optimizer, reference, activations) and total."""
    shards = s.gpus if s.sharded else 1
    weights = _weights(m, s)
    gathered = 2 * m.layer_params * s.weight_bytes if s.sharded and s.gpus > 1 else 0
    trainable, grad_bytes = (m.adapter_params, 4) if s.peft else (m.params, s.weight_bytes)
    grads = trainable * grad_bytes / shards
    if s.sharded and s.gpus > 1 and not s.peft:
        grads += m.layer_params * grad_bytes  # one layer's full gradient before its reduce-scatter
    if not s.sharded and s.gpus > 1:
        grads *= 2  # DDP's buckets: a second copy of every gradient
    per_state = (
        s.optimizer_fixed_bytes if s.optimizer_fixed_bytes is not None else s.optimizer_states * grad_bytes
    )
    parts = {
        "parameters": weights / shards + gathered,
        "gradients": grads,
        "optimizer": trainable * per_state / shards,
        "reference": weights / shards if s.reference else 0.0,
        "activations": activations(m, s),
        "step": step_temporaries(m, s),
    }
    # the backward frees each layer's activations as it makes that layer's gradients (set to None before
    # each forward): the step holds at most the larger of the two on top of the rest
    held = max(parts["activations"], grads + parts["step"])
    if s.device == "cpu":
        parts["runtime"] = s.runtime_bytes
        if s.heap_keeps_activations:  # glibc keeps the freed activations beside the gradients
            held = max(parts["activations"] + grads, grads + parts["step"])
    total = parts["parameters"] + parts["optimizer"] + parts["reference"] + held + parts.get("runtime", 0.0)
    return {**parts, "total": total}


def step_temporaries(m: Shape, s: Setup) -> float:
    """Bytes AdamW's step allocates beside the gradients (the module's docstring; 0 for SGD, 8-bit AdamW's
    kernels are fused)."""
    if s.optimizer_states != 2 or s.optimizer_fixed_bytes is not None or s.optimizer_step == "fused":
        return 0.0
    shards = s.gpus if s.sharded else 1
    if s.peft:  # the adapters' fp32 tensors: small beside the rest
        trainable, mlp, grad_bytes = m.adapter_params, 0, 4
    else:
        trainable, mlp, grad_bytes = m.params, m.hidden * m.intermediate, s.weight_bytes
    if s.optimizer_step == "foreach":
        return trainable * grad_bytes / shards
    # single: the largest tensor's square root and denominator, and the tensor before it's denominator
    return (2 * max(m.head_params, mlp) + mlp) * grad_bytes / shards


def _weights(m: Shape, s: Setup) -> float:
    if s.peft == "qlora":
        return m.linear_params * QLORA_BYTES + (m.params - m.linear_params) * s.weight_bytes
    return m.params * s.weight_bytes


def activations(m: Shape, s: Setup) -> float:
    """Bytes one micro-batch's forward keeps for its backward (see the module's docstring)."""
    a = 2 if (s.autocast or s.weight_bytes == 2) else 4  # compute dtype
    per_layer = a * (10 * m.hidden + 4 * m.intermediate + 4 * m.kv_dim)
    if s.peft:
        # dropout's copy and mask of each adapted input
        per_layer += (a + 1) * (6 * m.hidden + m.intermediate)
    residual = max(a, s.weight_bytes) * m.hidden
    if s.offload and s.checkpointing:  # layer inputs go to host memory as they are saved: one layer's stays
        per_token = per_layer
    else:
        per_token = (m.layers * residual + per_layer) if s.checkpointing else m.layers * per_layer
    tokens = s.sequences * s.seq_len
    local = -(-tokens // s.sequence_parallel)  # the positions this rank holds through the decoder
    held = local * per_token
    if s.sequence_parallel > 1:
        held += 2 * local * (m.hidden + 2 * m.kv_dim) * a  # one layer's q, k, v sent and received
        if not s.chunked_head:  # the model's own head: every position gathered and projected on every rank
            held += 2 * tokens * residual  # the gathered final hidden states, and the rows the head keeps
    logits = 3 * 4 + a  # per logit: compute dtype, fp32 upcast, log-softmax, its gradient
    chunk = s.head_chunk or HEAD_CHUNK[s.device]
    # the chunked head projects this rank's positions (ablate.speed.ulysses.Shard.scores)
    head = min(chunk, local * m.vocab) * logits if s.chunked_head else tokens * m.vocab * logits
    casts = 0.0
    if s.autocast and s.weight_bytes == 4:  # half-precision copies of the weights autocast multiplies
        # 4-bit: dequantized a layer at a time
        linear = 0 if s.peft == "qlora" else m.linear_params / (s.gpus if s.sharded else 1)
        casts = 2 * (linear + m.head_params)
    return held + head + casts


def what_fits(m: Shape, s: Setup, memory: float, heads: int) -> tuple[Setup, str] | None:
    """The first of the long-context levers that makes the plan fit `memory` bytes per GPU, with its
    overrides: gradient checkpointing, then sequences split over 2, 4, ... of the GPUs (at most `heads`
    ranks a sequence; with checkpointing), then activation offload on top. None when none does."""
    tried = []
    if not s.checkpointing:
        tried.append((dataclasses.replace(s, checkpointing=True), "method.args.gradient_checkpointing=true"))
    ckpt = "" if s.checkpointing else "method.args.gradient_checkpointing=true "
    n = max(s.sequence_parallel, 1) * 2
    while n <= min(s.gpus, heads):
        if s.gpus % n == 0:
            split = dataclasses.replace(s, checkpointing=True, sequence_parallel=n)
            tried.append((split, f"{ckpt}distributed.sequence_parallel={n}"))
        n *= 2
    if not s.offload:  # the same levers with the checkpointed inputs in host memory (a GPU's)
        offload = "+method.args.gradient_checkpointing_kwargs={offload:true}"
        tried += [(dataclasses.replace(t, offload=True), f"{w} {offload}") for t, w in list(tried)]
        if s.checkpointing:
            tried.append((dataclasses.replace(s, offload=True), offload))
    return next(((t, w) for t, w in tried if plan(m, t)["total"] <= memory), None)


def engine(
    params: int, weight_bytes: int, gpu_bytes: float, utilization: float, kv_cache_bytes: float | None
) -> float:
    """A vLLM engine's bytes on its GPU: its weights plus `kv_cache_bytes` when that is set (vLLM's
    kv_cache_memory_bytes; activations are left out, small beside them); else vLLM's own budget, `utilization`
    of the GPU's memory (weights, activations and KV cache together: TRL's vllm_gpu_memory_utilization)."""
    if kv_cache_bytes is not None:
        return params * weight_bytes + kv_cache_bytes
    return utilization * gpu_bytes
