"""Post-training methods on `transformers.Trainer` (conf/method/): one trainer + config per method,
wiring only; the math lives in `ablate.losses`."""
