"""`ablate plan`'s numbers against a measured peak, on this machine's CPU: the config's model (random
weights of its architecture, its dtype) runs two training steps on a micro-batch of the plan's shape
(random tokens, every position a loss token: a DPO step with precomputed reference log-probs is the
policy's forward over 2 x pairs sequences, an SFT step its forward over the batch) with bf16 autocast
when the config's precision says so, gradient checkpointing when it says so, and torch's AdamW; the second
step's peak of live tensor bytes (torch's MemTracker: every storage as it is made and freed, what
`torch.cuda.max_memory_allocated` counts on a GPU) is compared with the plan's total. Full fine-tuning on
one device only (what a CPU can run: no LoRA, no sharding, no live reference model).

    python benchmarks/plan_check.py model=smollm2_135m method=sft method.args.max_length=256 \
        method.args.per_device_train_batch_size=2
"""

from __future__ import annotations

import sys
from typing import Any


def measured_peak(cfg: Any, seq_len: int | None = None) -> tuple[float, float]:
    """(measured peak bytes, planned total bytes) for the composed config `cfg`."""
    import contextlib

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
    if s.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.randint(0, config.vocab_size, (s.sequences, s.seq_len))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if s.autocast else contextlib.nullcontext()

    def step() -> None:
        with autocast:
            logits = model(input_ids=ids).logits
        logps = logits[:, :-1].float().log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (-logps.sum(-1).mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # AdamW's state exists from here on, as in every step after a run's first
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        step()
    return float(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]), planned


def main() -> None:
    from hydra import compose, initialize_config_dir

    from ablate.config.compose import register_resolvers
    from ablate.paths import conf_dir

    register_resolvers()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=sys.argv[1:])
    peak, planned = measured_peak(cfg)
    print(f"{' '.join(sys.argv[1:]) or 'defaults'}: measured {peak / 1e6:.1f} MB, planned {planned / 1e6:.1f} MB "
          f"(plan / measured {planned / peak:.3f})")


if __name__ == "__main__":
    main()
