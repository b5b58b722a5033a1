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
"""

from __future__ import annotations

import sys
from typing import Any


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
    """The method scores a reference every step (not precomputed): DPO/KTO's live reference, GRPO/RLOO's beta."""
    args, name = cfg.method.args, str(cfg.method.name)
    if name in ("grpo", "rloo"):
        return float(args.get("beta") or 0) > 0
    return name in ("dpo", "kto") and not args.get("precompute_ref_log_probs", True)


def main() -> None:
    from hydra import compose, initialize_config_dir

    from ablate.config.compose import register_resolvers
    from ablate.paths import conf_dir

    register_resolvers()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=sys.argv[1:])
    peak, planned = measured_peak(cfg)
    print(
        f"{' '.join(sys.argv[1:]) or 'defaults'}: measured {peak / 1e6:.1f} MB, planned {planned / 1e6:.1f} MB "
        f"(plan / measured {planned / peak:.3f})"
    )


if __name__ == "__main__":
    main()
