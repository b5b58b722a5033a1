"""Where a run starts its rollout server (`method.rollouts.start=true`, ablate.rollouts.server), and how it
stops it:

- `start_on: local`: a child process on the trainer's machine (its own session, so the whole server is
  stopped at once), listening on 127.0.0.1 at the url's port;
- `start_on: slurm`: a SLURM job of its own (`sbatch --wrap`, with `method.rollouts.sbatch_args` for its
  partition, GPUs, time...), on whatever node SLURM gives it, listening on every address at the url's port;
  the url becomes that node's once the job runs. It needs what a SLURM cluster's jobs have anyway: the same
  Python environment and the run dir on a filesystem both nodes see. `scancel` stops it when training ends.

Either way the server's output goes to the run dir's `rollout_server.log`, and a server that ends before it
answers is one line with the log's last line."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from ablate.errors import ConfigError, missing_extra


@dataclass
class Started:
    """A server a run started: where it answers, its log, and how it is stopped."""

    url: str
    log: str
    process: subprocess.Popen | None = None  # local
    job: str | None = None  # slurm
    actor: Any = None  # ray

    def ended(self) -> str | None:
        """Why it is gone (None while it lives)."""
        if self.process is not None:
            code = self.process.poll()
            return None if code is None else f"exited ({code})"
        if self.actor is not None:
            import ray

            code = ray.get(self.actor.poll.remote())
            return None if code is None else f"exited ({code})"
        state = _squeue(self.job)[0]
        return (
            None
            if state in ("PENDING", "CONFIGURING", "RUNNING")
            else f"SLURM job {self.job} {state or 'gone'}"
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.job is not None:
            subprocess.run(["scancel", self.job], capture_output=True)
        if self.actor is not None:
            import ray

            ray.get(self.actor.stop.remote())
            ray.kill(self.actor)


def start_local(command: list[str], port: int, log: str, env: dict[str, str]) -> Started:
    with socket_probe() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            raise ConfigError(
                f"method.rollouts.start=true: port {port} is in use (another server, or a run's leftover); "
                "set method.rollouts.url=http://127.0.0.1:PORT, or start=false to use the one running"
            )
    with open(log, "ab") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    return Started(f"http://127.0.0.1:{port}", log, process=process)


def start_slurm(command: list[str], port: int, log: str, sbatch_args: list[str], timeout_s: float) -> Started:
    """Submit the server's job and wait until SLURM runs it on a node (the url's host)."""
    if shutil.which("sbatch") is None:
        raise ConfigError(
            "method.rollouts.start_on=slurm: no sbatch here (run it where SLURM's commands are)"
        )
    wrap = "VLLM_SERVER_DEV_MODE=1 exec " + shlex.join(command)
    submit = ["sbatch", "--parsable", "--job-name=ablate-rollouts", f"--output={log}", *sbatch_args]
    r = subprocess.run([*submit, "--wrap", wrap], capture_output=True, text=True)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["no message"])[-1]
        raise ConfigError(f"sbatch refused the rollout server's job (method.rollouts.sbatch_args): {why}")
    started = Started("", log, job=r.stdout.strip().split(";")[0])
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        state, node = _squeue(started.job)
        if state == "RUNNING" and node:
            started.url = f"http://{node}:{port}"
            return started
        if state not in ("PENDING", "CONFIGURING"):
            raise ConfigError(
                f"the rollout server's SLURM job {started.job} ended before it ran ({state or 'gone'}): "
                f"{last_line(log)} (its log: {log})"
            )
        time.sleep(2.0)
    started.stop()
    raise ConfigError(
        f"the rollout server's SLURM job {started.job} did not start within method.rollouts.start_timeout_s="
        f"{timeout_s:g} s (cancelled)"
    )


def start_ray(command: list[str], port: int, log: str, address: str, resources: dict[str, Any]) -> Started:
    """A Ray actor with `resources` on the cluster at `address` starts the server on its node."""
    try:
        import ray
    except ImportError:
        raise missing_extra("ray", "ray", "method.rollouts.start_on=ray") from None
    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    actor = ray.remote(**{"num_cpus": 1, **resources})(RayServer).remote()
    node = ray.get(actor.start.remote(command, log, {"VLLM_SERVER_DEV_MODE": "1"}))
    return Started(f"http://{node}:{port}", log, actor=actor)


class RayServer:
    """The Ray actor holding a rollout server's process (start_ray)."""

    def start(self, command: list[str], log: str, env: dict[str, str]) -> str:
        import ray

        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                start_new_session=True,
            )
        return ray.util.get_node_ip_address()

    def poll(self) -> int | None:
        return self.process.poll()

    def stop(self) -> None:
        Started("", "", process=self.process).stop()


def wait_until_it_answers(started: Started, timeout_s: float) -> float:
    """Seconds until the server answers /health, or one line (ConfigError) if it ends or takes too long."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        ended = started.ended()
        if ended is not None:
            raise ConfigError(
                f"the rollout server ablate started {ended} before it answered: {last_line(started.log)} "
                f"(its log: {started.log})"
            )
        if healthy(started.url):
            return time.monotonic() - t0
        time.sleep(1.0)
    started.stop()
    raise ConfigError(
        "the rollout server ablate started did not answer within "
        f"method.rollouts.start_timeout_s={timeout_s:g} s (stopped; its log: {started.log})"
    )


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


def last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return "no output"
    return lines[-1][-300:] if lines else "no output"


def socket_probe() -> Any:
    import socket

    return socket.socket()


def _squeue(job: str | None) -> tuple[str, str]:
    """(state, node) of a job SLURM still lists; ("", "") when it lists it no more."""
    r = subprocess.run(["squeue", "-h", "-j", str(job), "-o", "%T %N"], capture_output=True, text=True)
    state, _, node = r.stdout.strip().partition(" ")
    return state, node.strip()
