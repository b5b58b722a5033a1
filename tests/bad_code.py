"""Test helpers: code of a user's that fails (tests/integration/test_bad_inputs.py, issue 32): a callback,
a DPO loss and a data loader that raise, a loss that returns the wrong thing."""

from transformers import TrainerCallback


class Boom(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        raise KeyError("my callback broke")


def loss_raises(logp_c, logp_r, ref_c, ref_r, n_c, n_r, beta, **kwargs):
    raise ZeroDivisionError("my loss broke")


def loss_not_a_tensor(logp_c, logp_r, ref_c, ref_r, n_c, n_r, beta, **kwargs):
    return 1.0, {}


def loader_raises(**kwargs):
    raise OSError("my loader broke")
