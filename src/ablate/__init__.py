"""ablate: Hydra-composed LLM post-training experiments on `transformers.Trainer`."""

import logging as _logging

__version__ = "0.1.0"

# peft (imported by Trainer when installed) imports bitsandbytes, whose CPU backend warns at import, on
# CPUs with AVX512-BF16, that an optional speed-up package (`kernels`) is missing, even when nothing uses
# bitsandbytes: the first line of every run. Set before anything imports it (a logger's level, no import).
_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(_logging.ERROR)
