"""`ablate plan [overrides] [--gpus N] [--gpu-memory GB] [--seq-len N] [--cpu]`: the memory a run of the
composed config needs per GPU, before any weight is downloaded. The model is built on the meta device
from its config (ablate.models.architecture: a local dir's config.json, the HF cache's, or the one
ablate ships for its hub presets), its parameters counted, and ablate.models.memory does the arithmetic
for the config's method, precision, PEFT, optimizer, batch, gradient checkpointing (and offload),
`distributed` (and its sequence parallelism) and the LM head the trainer's speed paths run. A run that
does not fit is told the first long-context lever that would make it fit (`what_fits`). `--cpu` plans a
process on this machine instead: its peak resident memory, the libraries' as loaded here included.
"""

from __future__ import annotations

import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ablate.cli.exits import fail, one_line_errors
from ablate.config.checks import installed, needed_packages
from ablate.errors import ConfigError
from ablate.models.memory import GB, QLORA_BYTES, Setup, Shape, engine, plan, what_fits
from ablate.schema.method import MethodSpec

WEIGHT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
GRPO_PROMPT = 512  # prompt tokens counted when max_prompt_length is null (whole prompts)


def meta_model(model_cfg: DictConfig) -> Any:
    """The config's model on the meta device (no memory, no download), or a one-line ConfigError."""
    import torch

    target = str(model_cfg.get("_target_", ""))
    with torch.device("meta"):
        if target == "ablate.models.tiny":
            from ablate.models import tiny

            kw = {k: v for k, v in model_cfg.items() if not k.startswith("_") and k != "quantization_config"}
            return tiny(**kw)[1]
        if target in ("ablate.models.pretrained", "ablate.models.smollm2_135m"):
            return _pretrained(model_cfg, target)
    raise ConfigError(
        f"model._target_={target}: ablate plan builds ablate's model presets (tiny, local, "
        f"smollm2_135m, qwen2_5_0_5b, qwen2_5_7b, llama3_1_8b), not a builder of yours"
    )


def _pretrained(model_cfg: DictConfig, target: str) -> Any:
    from transformers import AutoModelForCausalLM

    from ablate.models.architecture import build_config, config_values, scaled_down

    path = SMOLLM2 if target == "ablate.models.smollm2_135m" else str(model_cfg.path)
    revision = model_cfg.get("revision")
    if model_cfg.get("config_overrides") is not None:
        return scaled_down(path, revision, dict(model_cfg.config_overrides))[1]
    return AutoModelForCausalLM.from_config(build_config(config_values(path, revision)))


def shape(model: Any, peft_cfg: DictConfig | None) -> Shape:
    """What the arithmetic needs, counted from the (meta) model and the LoRA config."""
    import torch

    config = model.config
    layers = model.model.layers
    head = model.get_output_embeddings().weight
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n]
    adapters = 0
    if peft_cfg is not None:
        targets = peft_cfg.target_modules
        for name, m in linears:
            if targets == "all-linear" or name.rsplit(".", 1)[-1] in targets:
                adapters += peft_cfg.r * (m.in_features + m.out_features) + (
                    m.out_features if peft_cfg.use_dora else 0
                )
    heads = config.num_key_value_heads or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return Shape(
        params=sum(p.numel() for p in model.parameters()),
        linear_params=sum(m.weight.numel() for _, m in linears),
        layer_params=sum(p.numel() for p in layers[0].parameters()),
        adapter_params=adapters,
        layers=len(layers),
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        kv_dim=heads * head_dim,
        vocab=head.shape[0],
        head_params=head.numel(),
    )


def setup(cfg: DictConfig, gpus: int, seq_len: int | None, cpu: bool = False) -> tuple[Setup, list[str]]:
    """How the composed config trains (its method's facts: ablate.schema.method), and notes on what was
    assumed. `cpu`: each process's resident memory on this machine (ablate.models.memory, "On a CPU")."""
    args, notes = cfg.method.args, []
    spec = MethodSpec.of(cfg.method)
    peft = None if cfg.get("peft") is None else ("qlora" if cfg.model.get("quantization_config") else "lora")
    opt = str(cfg.optimizer.optimizer._target_)
    states, fixed = 2.0, None
    if opt.endswith("SGD"):
        states = 1.0 if cfg.optimizer.optimizer.get("momentum", 0) else 0.0
    elif "8bit" in opt:
        fixed = 2.0
    # torch.optim.AdamW's step: fused when asked, else foreach, its default on a GPU (single-tensor on a CPU)
    node = cfg.optimizer.optimizer
    foreach = node.get("foreach")
    step = (
        "fused"
        if node.get("fused")
        else ("foreach" if foreach or (foreach is None and not cpu) else "single")
    )
    if spec.generates:  # a sequence is a prompt and a sampled completion
        prompt = args.get("max_prompt_length")
        if prompt is None:
            notes.append(
                f"max_prompt_length is null: prompts counted as {GRPO_PROMPT} tokens (--seq-len to say)"
            )
        length = int(prompt or GRPO_PROMPT) + int(args.max_completion_length)
    else:
        length = int(args.get("max_length") or 512)
    ref_model = cfg.method.trainer.get("ref_model") is not None
    return Setup(
        weight_bytes=WEIGHT_BYTES[str(cfg.model.get("dtype", "float32"))],
        autocast=bool(cfg.precision.get("bf16") or cfg.precision.get("fp16")),
        peft=peft,
        optimizer_states=states,
        optimizer_fixed_bytes=fixed,
        optimizer_step=step,
        reference=spec.reference_copy(args, ref_model, adapters=peft is not None),
        sequences=spec.sequences(int(args.per_device_train_batch_size)),
        seq_len=seq_len or length,
        checkpointing=bool(args.get("gradient_checkpointing")),
        gpus=gpus,
        sharded=bool(cfg.distributed.get("fsdp")),
        **long_context(cfg),
        **(on_this_cpu(cfg) if cpu else {}),
    ), notes


def on_this_cpu(cfg: DictConfig) -> dict[str, Any]:
    """A CPU run's own terms: the libraries' resident memory, measured in this process once it has loaded
    what the run loads (torch, transformers, the method's trainer: long_context imported it), and whether
    glibc keeps freed activations in its heap (malloc_mmap_threshold unset)."""
    import psutil

    return {
        "device": "cpu",
        "runtime_bytes": float(psutil.Process().memory_info().rss),
        "heap_keeps_activations": cfg.get("malloc_mmap_threshold") is None,
    }


def long_context(cfg: DictConfig) -> dict[str, Any]:
    """What decides a long sequence's memory: the ranks that split it, activation offload, and whether the
    method's trainer projects the LM head in chunks (its speed paths, when `speed` requests them)."""
    from hydra.utils import get_class

    trainer = get_class(str(cfg.method.trainer._target_))
    paths = getattr(trainer, "speed_paths", {})
    return {
        "sequence_parallel": int(cfg.distributed.get("sequence_parallel") or 1),
        "offload": any(  # transformers' activation offload: checkpointed layers' inputs in pinned host memory
            bool((cfg.method.args.get(k) or {}).get("offload"))
            for k in ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs")
        ),
        "chunked_head": "completion_only_logits" in paths and bool(cfg.speed.get("completion_only_logits")),
    }


def planned(
    cfg: DictConfig, gpus: int, seq_len: int | None, cpu: bool = False
) -> tuple[Shape, Setup, dict[str, float], list[str]]:
    """The model's shape, how it trains, the bytes per GPU (per process: `cpu`) of each part (and their
    total; a vLLM engine's: engine_plan), and notes."""
    m = shape(meta_model(cfg.model), cfg.get("peft"))
    s, notes = setup(cfg, gpus, seq_len, cpu)
    parts = plan(m, s)
    return m, s, parts, notes + other_models(cfg, m, s, parts)


def report(
    cfg: DictConfig, gpus: int, memory: float, seq_len: int | None, out: Any = sys.stdout, cpu: bool = False
) -> bool:
    """Print the plan; True if it fits `memory` GB per GPU (per process on this CPU: `cpu`)."""
    m, s, parts, notes = planned(cfg, gpus, seq_len, cpu)
    unit, units = ("process", "processes") if cpu else ("GPU", "GPUs")
    model = cfg.model.get("path") or str(cfg.model._target_).rsplit(".", 1)[-1]
    wrap = f"FSDP full shard over {gpus}" if s.sharded else (f"DDP over {gpus}" if gpus > 1 else "1")
    autocast = f", {'bf16' if cfg.precision.get('bf16') else 'fp16'} autocast" if s.autocast else ""
    print(
        f"{model}: {m.params / 1e9:.3f}B parameters ({m.params:,}), {cfg.method.name}, "
        f"{'PEFT ' + s.peft + f' ({m.adapter_params:,} trainable)' if s.peft else 'full fine-tuning'}, "
        f"{cfg.model.get('dtype', 'float32')} weights{autocast}, "
        f"gradient checkpointing {'on' if s.checkpointing else 'off'}, {wrap} {units if gpus > 1 else unit}",
        file=out,
    )
    split = f", split over {s.sequence_parallel} {units}" if s.sequence_parallel > 1 else ""
    head = "the LM head in chunks" if s.chunked_head else "full logits"
    offload = ", activations offloaded to host memory" if s.offload else ""
    print(f"micro-batch: {s.sequences} sequences x {s.seq_len} tokens{split}; {head}{offload}", file=out)
    for note in notes:
        print(f"note: {note}", file=out)
    packages = [
        f"{module} (pip install 'ablate[{extra}]'{'' if installed(module) else ', not installed here'})"
        for _, _, module, extra in needed_packages(cfg)
    ]
    if packages:
        print(f"the run needs: {', '.join(packages)}", file=out)
    rollouts = engine_plan(cfg, m, memory, parts, out)
    print(f"per {unit}:", file=out)
    for part, value in sorted(parts.items(), key=lambda kv: kv[0] == "total"):  # the total last
        print(f"  {part:12} {size(value):>10}", file=out)
    if rollouts:
        print(rollouts, file=out)
    fits = parts["total"] <= memory * GB
    print(
        f"{'fits' if fits else 'does not fit'} in {memory:.3g} GB per {unit} "
        f"({size(parts['total'])}, {100 * parts['total'] / (memory * GB):.0f}%)",
        file=out,
    )
    colocated = parts.get("engine", 0.0)  # a vLLM engine on these GPUs stays whatever the lever
    lever = None if fits else what_fits(m, s, memory * GB - colocated, int(meta_heads(cfg)))
    if lever is not None:
        total = plan(m, lever[0])["total"] + colocated
        print(f"would fit with {lever[1]} ({size(total)}, {100 * total / (memory * GB):.0f}%)", file=out)
    return fits


def other_models(cfg: DictConfig, m: Shape, s: Setup, parts: dict[str, float]) -> list[str]:
    """The models beside the policy, counted as they load, without importing an optional package: a teacher
    built from its own config, a reference loaded in 8 or 4 bits (bitsandbytes: decoder Linear weights at 1
    byte, or NF4); a vLLM engine: engine_plan. Updates `parts` and its total; returns notes."""
    notes, shards = [], s.gpus if s.sharded else 1
    reference = None
    teacher = OmegaConf.select(cfg, "method.trainer.teacher", default=None)
    quant = OmegaConf.select(cfg, "method.trainer.ref_model.quantization_config", default=None)
    if s.reference and isinstance(teacher, DictConfig):
        try:
            t = shape(meta_model(teacher), None)
            reference = t.params * WEIGHT_BYTES[str(teacher.get("dtype", "float32"))]
        except ConfigError:  # a teacher of code (the tiny task's scripted one, a user's builder)
            notes.append("the teacher counted as a copy of the student (reference)")
    elif s.reference and quant is not None and (quant.get("load_in_4bit") or quant.get("load_in_8bit")):
        per_weight = QLORA_BYTES if quant.get("load_in_4bit") else 1.0
        reference = m.linear_params * per_weight + (m.params - m.linear_params) * s.weight_bytes
        notes.append(f"the reference's decoder weights counted at {8 * per_weight:.2g} bits (bitsandbytes)")
    if reference is not None:
        parts["total"] += reference / shards - parts["reference"]
        parts["reference"] = reference / shards
    return notes


def engine_plan(cfg: DictConfig, m: Shape, memory: float, parts: dict[str, float], out: Any) -> str | None:
    """A vLLM engine's memory (`method/rollouts=vllm|vllm_server`, ablate.models.memory.engine): on every
    training GPU when colocated (added to `parts` before the total), else a line on the server's own GPU."""
    node = cfg.method.get("rollouts")
    if node is None or "gpu_memory_utilization" not in node:
        return None
    from hydra.utils import get_class

    kv = None if node.kv_cache_gib is None else node.kv_cache_gib * 2**30
    weight_bytes = WEIGHT_BYTES.get(str(node.dtype), 2)  # "auto": the checkpoint's, bf16 for the presets
    engine_bytes = engine(m.params, weight_bytes, memory * GB, node.gpu_memory_utilization, kv)
    what = f"vLLM engine ({node.dtype} weights {size(m.params * weight_bytes)} + KV cache)"
    if get_class(node._target_).on_trainer_gpus:
        parts["engine"] = engine_bytes
        parts["total"] += engine_bytes
        print(f"rollouts: a {what} on every training GPU: {size(engine_bytes)}", file=out)
        return None
    return (
        f"rollouts: a server of their own ({node.url}): none on these GPUs; the server's GPU holds the "
        f"{what}: {size(engine_bytes)} of {memory:g} GB"
    )


def meta_heads(cfg: DictConfig) -> int:
    """The model's attention heads (sequence parallelism splits them over the ranks)."""
    return meta_model(cfg.model).config.num_attention_heads


def size(n: float) -> str:
    return f"{n / GB:.2f} GB" if n >= GB / 10 else f"{n / 1e6:.1f} MB"


def plan_cmd(args: Any) -> None:
    """`ablate plan` (arguments: ablate.cli.parser). Exit 0 if it fits, 1 if it does not, 2 on a mistake."""
    from ablate.cli.data import _compose

    if args.gpus < 1:
        fail(f"--gpus {args.gpus}: must be 1 or more")
    if args.gpu_memory is None:  # a GPU's 80 GB, or this machine's memory shared by its processes
        import psutil

        args.gpu_memory = psutil.virtual_memory().total / GB / args.gpus if args.cpu else 80.0
    if not args.gpu_memory > 0:
        fail(f"--gpu-memory {args.gpu_memory:g}: must be a positive number of GB (80 for an A100/H100 80GB)")
    if args.seq_len is not None and args.seq_len < 1:
        fail(f"--seq-len {args.seq_len}: must be 1 or more tokens")
    with one_line_errors():  # a plan is arithmetic: it imports none of the optional packages it names
        cfg = _compose(args.overrides, args.config_dir, packages=False)
        fits = report(cfg, args.gpus, args.gpu_memory, args.seq_len, cpu=args.cpu)
    sys.exit(0 if fits else 1)
