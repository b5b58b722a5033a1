"""Walking an error's chain (`ablate.errors.chain`): every walker (the full disk, a lost peer, the user's
error behind Hydra's wrapper, a bad config file, the datasets cache) stops where a chain loops back on
itself, and a method's own config refusal is raised without making one (it did: `raise cause from e`
with `e.__cause__` being `cause` hung `ablate train` in the disk-full check, at 100% CPU, for ever)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from ablate.errors import ConfigError, chain, user_error
from ablate.paths import conf_dir
from ablate.record import rundir
from ablate.config.compose import register_resolvers


def _loop() -> tuple[Exception, Exception, Exception]:
    """wrapper --cause--> inner --cause--> wrapper (a loop), and inner --context--> handled."""
    wrapper, inner, handled = RuntimeError("wrapper"), KeyError("inner"), OSError("handled")
    wrapper.__cause__, inner.__cause__ = inner, wrapper
    inner.__context__ = handled
    return wrapper, inner, handled


def test_chain_yields_each_error_once_and_stops_at_a_loop():
    wrapper, inner, handled = _loop()
    assert list(chain(wrapper)) == [wrapper, inner]  # inner's cause (wrapper) comes before its context
    inner.__cause__ = None
    assert list(chain(wrapper)) == [wrapper, inner, handled]
    assert list(chain(wrapper, context=False)) == [wrapper, inner]
    assert list(chain(None)) == []


def test_walkers_return_on_a_looping_chain():
    wrapper, _, _ = _loop()
    assert rundir.disk_full(wrapper) is False
    assert user_error(wrapper) is None
    full = OSError(28, "No space left on device")
    wrapper.__cause__.__context__ = full  # still looping through __cause__, the full disk one step aside
    wrapper.__cause__.__cause__ = None
    assert rundir.disk_full(wrapper) is True


def test_a_method_args_refusal_is_one_config_error_with_a_finite_chain(tmp_path: Path):
    """GRPOConfig refuses generation_dtype without max_staleness (the launcher's rules say so first; here
    they are bypassed, as for any check only the dataclass makes): ablate.train.training_args raises a
    ConfigError with that line whose chain ends (followed by hand, bounded), and the run's disk-full
    check returns on it."""
    from ablate.train import training_args

    register_resolvers()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["method=grpo", "method.args.generation_dtype=bfloat16"])
    with pytest.raises(
        ConfigError,
        match="method.args.generation_dtype=bfloat16: must be null, float32 or bfloat16, with method.args.max_staleness > 0",
    ) as raised:
        training_args(cfg, tmp_path)
    e, steps = raised.value, 0
    while e is not None and steps < 20:
        e, steps = e.__cause__ or e.__context__, steps + 1
    assert e is None, "the error's chain loops"
    assert rundir.disk_full(raised.value) is False
