"""ablate's vLLM plugin (pyproject's `vllm.general_plugins` entry point, loaded by vLLM in every process it
starts): the `gloo` weight-transfer backend of ablate.rollouts.transfer, registered by module path so nothing
is imported until a server or a trainer uses it. Cheap and safe to call more than once (vLLM may).
"""

from __future__ import annotations

import contextlib

BACKEND = "gloo"


def register() -> None:
    """The gloo backend in vLLM's worker-side and trainer-side weight-transfer factories."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    for factory, engine in (
        (WeightTransferEngineFactory, "GlooWeightTransferEngine"),
        (WeightTransferTrainerFactory, "GlooTrainerWeightTransferEngine"),
    ):
        with contextlib.suppress(ValueError):  # "already registered": an earlier call in this process
            factory.register_engine(BACKEND, "ablate.rollouts.transfer", engine)
