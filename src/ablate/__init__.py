"""ablate: Hydra-composed LLM post-training experiments on `transformers.Trainer`."""

__version__ = "0.1.0"
