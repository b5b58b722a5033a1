"""`transformers.Trainer` subclasses: wiring only; the math lives in `ablate.losses`."""
