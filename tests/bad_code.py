"""Test helpers: code of a user's that fails (tests/integration/test_bad_inputs.py): a callback,
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


class DeleteRunDirAt(TrainerCallback):
    """Deletes the whole run dir at step ABLATE_TEST_DELETE_AT (a user's `rm -rf` while the run trains)."""

    def on_step_end(self, args, state, control, **kwargs):
        import os
        import shutil
        from pathlib import Path

        if state.global_step == int(os.environ.get("ABLATE_TEST_DELETE_AT", "2")):
            shutil.rmtree(Path(args.output_dir).parent)


class FileSizeLimitAfterFirstSave(TrainerCallback):
    """Lowers this process's file-size limit (RLIMIT_FSIZE, `ulimit -f`) to 64 KiB once the first checkpoint is
    saved: the next checkpoint's weights pass it (as a `ulimit -f` the model outgrows would)."""

    def on_save(self, args, state, control, **kwargs):
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
