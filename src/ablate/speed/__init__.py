"""The speed paths: exact re-layouts of the same computation (shared prompts, packed rows, the LM
head only where scored, lean layers) and the throughput/MFU callback. Each path has a parity test
against the plain computation it replaces."""
