"""Test helper: records the dtype the model's layers compute in while training (autocast is visible
only inside the forward: accelerate converts the model's outputs back to fp32)."""

import json
import os

import torch
from transformers import TrainerCallback


class DtypeProbe(TrainerCallback):
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.seen: set[str] = set()
        first_linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        first_linear.register_forward_hook(lambda _mod, _inp, out: self.seen.add(str(out.dtype)))

    def on_train_end(self, args, state, control, **kwargs):
        path = os.environ.get("ABLATE_TEST_DTYPE_OUT")
        if path and state.is_world_process_zero:
            with open(path, "w") as f:
                json.dump({"linear_out": sorted(self.seen), "device": args.device.type}, f)
