"""The speed paths: exact re-layouts of the same computation (shared prompts, packed rows, the LM
head only where scored, lean layers, GRPO's shared-prefill generation) and the throughput/MFU callback.
Each path has a parity test against the plain computation it replaces. Which paths a run uses is
decided once, with the reason for each one that is off, by `plan.resolve` (switches: conf/speed/); the
trainers score each batch with one function of `scoring`, following that plan."""
