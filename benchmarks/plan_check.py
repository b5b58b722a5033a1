"""`ablate plan`'s numbers against a measured peak, on this machine's CPU: the config's model (random
weights of its architecture, its dtype) runs two training steps on a micro-batch of the plan's shape
(random tokens, every position a loss token: a DPO step with precomputed reference log-probs is the
policy's forward over 2 x pairs sequences, an SFT step its forward over the batch) with bf16 autocast
when the config's precision says so, gradient checkpointing when it says so, and torch's AdamW; the second
step's peak of live tensor bytes (torch's MemTracker: every storage as it is made and freed, what
`torch.cuda.max_memory_allocated` counts on a GPU) is compared with the plan's total. `+peft=lora`: the
config's adapters (ablate.models.adapters), AdamW over them alone. A live reference (the plan counts one:
`method.args.precompute_ref_log_probs=false`, GRPO's beta > 0): a frozen copy in memory (with LoRA the
policy itself, its adapters off: no copy), its log-probs scored without gradients, once (its forward's
transient peak is below the policy's step). One device only: no sharding, no QLoRA (bitsandbytes' 4-bit kernels need a GPU).

    python benchmarks/plan_check.py model=smollm2_135m method=sft method.args.max_length=256 \
        method.args.per_device_train_batch_size=2

`--trainer`: the method's own trainer instead (`trained`), two steps of the config's data with the speed
paths off (TRL's layout, which the plan counts), the plan taken at the longest micro-batch it ran:

    python benchmarks/plan_check.py --trainer method=kto
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


def measured_peak(cfg: Any, seq_len: int | None = None) -> tuple[float, float]:
    """(measured peak bytes, planned total bytes) for the composed config `cfg`."""
    import contextlib
    import copy

    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from ablate.cli.plan import WEIGHT_BYTES, meta_model, setup, shape
    from ablate.models.memory import plan

    s, _ = setup(cfg, 1, seq_len)
    planned = plan(shape(meta_model(cfg.model), None), s)["total"]
    with torch.device("meta"):
        config = meta_model(cfg.model).config
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    dtype = {4: torch.float32, 2: torch.bfloat16}[WEIGHT_BYTES[str(cfg.model.get("dtype", "float32"))]]
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    reference = copy.deepcopy(model).eval().requires_grad_(False) if s.reference else None
    live = s.reference or (s.peft is not None and _scores_reference(cfg))  # LoRA: the adapters-off forward
    if s.peft == "qlora":
        raise SystemExit("plan_check: QLoRA needs a GPU (bitsandbytes' 4-bit kernels)")
    if s.peft is not None:
        from ablate.models.adapters import with_adapters

        model = with_adapters(model, cfg.peft)
    if s.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    ids = torch.randint(0, config.vocab_size, (s.sequences, s.seq_len))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if s.autocast else contextlib.nullcontext()

    ref = 0.0
    if (
        live
    ):  # the reference's log-probs (a copy's, or the policy's with its adapters off), scored once, before
        # the tracked step: without gradients its peak is below the step's (MemTracker takes one call a module)
        off = model.disable_adapter() if reference is None else contextlib.nullcontext()
        with torch.no_grad(), autocast, off:
            ref = (reference or model)(input_ids=ids).logits[:, :-1].float().log_softmax(-1)
            ref = ref.gather(-1, ids[:, 1:, None]).squeeze(-1).sum(-1)

    def step() -> None:
        with autocast:
            logits = model(input_ids=ids).logits
        logps = logits[:, :-1].float().log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (-(logps.sum(-1) - ref).mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # AdamW's state exists from here on, as in every step after a run's first
    tracker = MemTracker()
    tracker.track_external(model, opt, *([reference] if reference is not None else []))
    for p in [*model.parameters(), *(reference.parameters() if reference is not None else [])]:
        if not p.requires_grad:  # frozen (LoRA's base, the reference): MemTracker would hook its gradient
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
    with tracker:
        step()
    return float(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]), planned


class _NoHook:
    """Stands for the gradient hooks MemTracker registers on a parameter (none on a frozen one)."""

    def remove(self) -> None:
        pass


def _scores_reference(cfg: Any) -> bool:
    """The method scores a reference every step (not precomputed: its facts, ablate.schema.method)."""
    from ablate.schema.method import MethodSpec

    ref_model = cfg.method.trainer.get("ref_model") is not None
    return MethodSpec.of(cfg.method).scores_reference(cfg.method.args, ref_model)


@dataclass(frozen=True)
class Trained:
    """What a method's own trainer ran (`trained`): the policy's micro-batches with gradients, whether another
    model (a reference, a teacher) was in memory, and the peak of live tensor bytes over its steps."""

    batches: list[tuple[int, int]]  # (sequences, tokens) of each forward with gradients
    reference: bool
    peak: float


def trained(cfg: Any, out: str) -> Trained:
    """Train the composed config `cfg` (its method's own trainer, built as ablate.train builds it) for its
    steps in `out`, counting every tensor's storage from the model's weights on (`LiveBytes`)."""
    import torch
    from hydra.utils import instantiate

    from ablate.models.adapters import with_adapters, with_head

    args = instantiate(cfg.method.args, output_dir=out, use_cpu=True, report_to="none")
    make = instantiate(cfg.method.trainer)
    data = instantiate(cfg.data)
    tokenizer, model = instantiate(cfg.model)
    model = with_adapters(with_head(model, cfg.method), cfg.get("peft"))
    optimizer = {f"{k}_factory": instantiate(cfg.optimizer[k]) for k in ("optimizer", "scheduler")}
    trainer = make(model=model, args=args, train_dataset=data.train, processing_class=tokenizer, **optimizer)
    batches: list[tuple[int, int]] = []

    def seen(module: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]
        if torch.is_grad_enabled():
            batches.append(tuple(ids.shape))

    others = [getattr(trainer, k, None) for k in ("ref_model", "teacher")]
    others = [m for m in others if isinstance(m, torch.nn.Module)]
    hook = trainer.model.register_forward_pre_hook(seen, with_kwargs=True)
    live = LiveBytes()
    for m in [trainer.model, *others]:
        for t in [*m.parameters(), *m.buffers()]:
            live.add(t)
    with live:
        trainer.train()
    hook.remove()
    return Trained(batches, bool(others), float(live.peak))


class LiveBytes(TorchDispatchMode):
    """The bytes of CPU tensor storages alive, and their peak: each storage counted when an op makes it (or
    `add` is given it) until it is freed, as torch's MemTracker counts them, without its per-module
    bookkeeping (which refuses a module called twice a step: KTO's KL forward, GRPO's generation)."""

    def __init__(self) -> None:
        super().__init__()
        from torch.utils.weak import WeakIdKeyDictionary

        self.seen = WeakIdKeyDictionary()
        self.now = self.peak = 0

    def add(self, t: Any) -> None:
        import weakref

        import torch

        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            return
        storage = t.untyped_storage()
        if storage in self.seen:
            return
        self.seen[storage] = n = storage.nbytes()
        self.now += n
        self.peak = max(self.peak, self.now)
        weakref.finalize(storage, self._free, n)

    def _free(self, n: int) -> None:
        self.now -= n

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        from torch.utils._pytree import tree_flatten

        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            self.add(t)
        return out


def main() -> None:
    from hydra import compose, initialize_config_dir

    from ablate.config.compose import register_resolvers
    from ablate.paths import conf_dir

    trainer = sys.argv[1:2] == ["--trainer"]
    overrides = sys.argv[2:] if trainer else sys.argv[1:]
    register_resolvers()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=[*TRAINED, *overrides] if trainer else overrides)
    if trainer:
        import tempfile

        from ablate.cli.plan import planned as plan_of

        with tempfile.TemporaryDirectory() as out:
            run = trained(cfg, out)
        peak, planned = run.peak, plan_of(cfg, 1, max(t for _, t in run.batches))[2]["total"]
    else:
        peak, planned = measured_peak(cfg)
    print(
        f"{' '.join(overrides) or 'defaults'}: measured {peak / 1e6:.1f} MB, planned {planned / 1e6:.1f} MB "
        f"(plan / measured {planned / peak:.3f})"
    )


# `--trainer`: TRL's layout (what the plan counts), two steps (the second holds the optimizer's state), no files
TRAINED = ("speed=off", "cache=off", "method.args.max_steps=2", "method.args.save_strategy=no")


if __name__ == "__main__":
    main()
