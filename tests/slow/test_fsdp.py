"""FSDP2 on CPU (distributed=fsdp, torchrun, 2 gloo ranks) and a 2-node torchrun job on loopback.

Every run is a tiny model, 4 steps, fp32, checkpoints at steps 2 and 4 (sharded: DCP files, each rank
its own; one run FULL_STATE_DICT), the speed paths on (through FSDP2's forward, as through DDP's). Sharded runs
must give the 2-rank DDP run's per-step losses (1e-5): the same global batch, gradients reduced
instead of all-reduced. The DDP and FSDP DPO runs are shared by the tests of this module (fixtures).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from conftest import ROOT, TESTS, metrics, summary

pytestmark = pytest.mark.slow

STEPS = ["method.args.max_steps=4", "method.args.logging_steps=1", "method.args.save_steps=2"]
TIMEOUT = 600  # per torchrun; each takes ~40 s here (mostly imports)


def _env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        **extra,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }


def _torchrun(
    run_dir: Path,
    *overrides: str,
    env: dict[str, str] | None = None,
    check: bool = True,
    ranks: int = 2,
    steps: list[str] = STEPS,
) -> subprocess.CompletedProcess:
    """One node, 2 ranks (torchrun picks a free port for the group: --standalone)."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={ranks}",
            "-m",
            "ablate",
            "train",
            "method.args.use_cpu=true",
            *steps,
            *overrides,
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


def _losses(run_dir: Path) -> list[float]:
    return [e["loss"] for e in metrics(run_dir) if "loss" in e]  # the end-of-training event has train_loss


def _plan(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())["speed_plan"]["policy"]


def _check_sharded(run_dir: Path) -> None:
    """The run was sharded (FSDP2's sharded checkpoint: a DCP dir for the model and one for the
    optimizer, a .distcp file per rank in each, nothing gathered; the plan's wrapper), and model/ is a
    plain from_pretrained dir with the gathered weights (the last checkpoint's, read from its shards)."""
    import torch
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM

    assert summary(run_dir)["status"] == "completed" and summary(run_dir)["global_step"] == 4
    ckpt = run_dir / "checkpoints" / "checkpoint-4"
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):  # accelerate's sharded FSDP layout
        assert {p.name for p in (ckpt / part).iterdir()} == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    assert not list(ckpt.glob("*.bin")) and not list(ckpt.glob("*.safetensors"))  # nothing whole
    assert {p.name for p in ckpt.glob("rng_state_*.pth")} == {"rng_state_0.pth", "rng_state_1.pth"}
    plan = _plan(run_dir)
    assert plan["setting"]["wrapper"] == "fsdp"
    assert all(p["on"] for p in plan["paths"].values())  # every speed path runs through FSDP2's forward
    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    saved = load_file(str(run_dir / "model" / "model.safetensors"))
    dcp_to_torch_save(
        ckpt / "pytorch_model_fsdp_0", run_dir / "consolidated.pt"
    )  # the shards, in one process
    final = torch.load(run_dir / "consolidated.pt")["model"]
    assert saved.keys() <= final.keys() and saved
    for k, v in saved.items():
        assert (v == final[k]).all(), k
        assert (model.state_dict()[k] == v).all(), k


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fsdp")


@pytest.fixture(scope="module")
def ddp_dpo(runs: Path) -> Path:
    _torchrun(runs / "ddp_dpo")
    assert len(set(_losses(runs / "ddp_dpo"))) == 4  # the losses move: equality below means something
    return runs / "ddp_dpo"


@pytest.fixture(scope="module")
def fsdp_dpo(runs: Path) -> Path:
    r = _torchrun(runs / "fsdp_dpo", "distributed=fsdp")
    # the plan's one line (stdout; its table: the run dir's speed_plan.txt): every path on under FSDP2
    assert "policy 4/4 paths on" in next(
        line for line in r.stdout.splitlines() if line.startswith("speed plan:")
    )
    return runs / "fsdp_dpo"


def test_dpo_under_fsdp_equals_ddp(ddp_dpo: Path, fsdp_dpo: Path) -> None:
    """Precomputed reference log-probs (DPO's default), full fine-tune."""
    _check_sharded(fsdp_dpo)
    assert _losses(fsdp_dpo) == pytest.approx(_losses(ddp_dpo), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize(
    "name,overrides,ddp_only",
    [
        ("sft", ["method=sft"], []),  # its FSDP run in the gathered form (FULL_STATE_DICT)
        (
            "grpo",
            ["method=grpo", "method.args.per_device_train_batch_size=16"],
            [],
        ),  # generation in full_params
        # reference: the adapters off. LoRA dropout draws per element of the layout: both runs have the same
        # speed paths (on), else packed rows draw other masks (grad norm 0.103 vs 0.109 at step 1)
        ("dpo_lora_live_ref", ["+peft=lora", "method.args.precompute_ref_log_probs=false"], []),
    ],
)
def test_method_under_fsdp_equals_ddp(
    runs: Path, name: str, overrides: list[str], ddp_only: list[str]
) -> None:
    ddp, fsdp = runs / f"ddp_{name}", runs / f"fsdp_{name}"
    _torchrun(ddp, *overrides, *ddp_only)
    gathered = name == "sft"  # rank 0 writes the whole model and optimizer state
    full = ["distributed.fsdp_config.state_dict_type=FULL_STATE_DICT"] if gathered else []
    _torchrun(fsdp, *overrides, "distributed=fsdp", *full)
    assert summary(fsdp)["status"] == "completed" and _plan(fsdp)["setting"]["wrapper"] == "fsdp"
    if (
        name == "grpo"
    ):  # the same samples: the logged loss is ~0 early on, so compare what comes from the log-probs too
        pick = lambda run, k: [e[k] for e in metrics(run) if k in e]  # noqa: E731
        assert len(pick(fsdp, "reward")) == 4 and pick(fsdp, "reward") == pick(ddp, "reward")
        assert pick(fsdp, "entropy") == pytest.approx(pick(ddp, "entropy"), rel=1e-5, abs=1e-6)
    else:
        assert len(set(_losses(ddp))) == 4
    assert _losses(fsdp) == pytest.approx(_losses(ddp), rel=1e-5, abs=1e-6)
    assert (
        fsdp / "model" / ("adapter_model.safetensors" if "lora" in name else "model.safetensors")
    ).is_file()
    assert (fsdp / "checkpoints" / "checkpoint-4" / "pytorch_model_fsdp.bin").is_file() == gathered
    assert (fsdp / "checkpoints" / "checkpoint-4" / "pytorch_model_fsdp_0").is_dir() != gathered


def test_fsdp_resume_after_kill_equals_the_uninterrupted_run(runs: Path, fsdp_dpo: Path) -> None:
    """Both ranks are SIGKILLed at step 3 (after checkpoint-2); the same command again resumes from
    checkpoint-2 and ends with the uninterrupted run's losses and weights."""
    run_dir = runs / "fsdp_killed"
    kill = ["distributed=fsdp", "+callbacks.kill._target_=crashing.KillAt"]
    r = _torchrun(run_dir, *kill, env=_env(ABLATE_TEST_KILL_AT="3"), check=False)
    assert r.returncode != 0 and list(run_dir.glob("killed.*"))
    assert not (run_dir / "summary.json").exists() or summary(run_dir)["status"] != "completed"
    assert (run_dir / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file()
    _torchrun(run_dir, *kill)
    assert _losses(run_dir) == _losses(fsdp_dpo)  # bit-identical, not merely close
    from safetensors.torch import load_file

    a, b = (
        load_file(str(run_dir / "model" / "model.safetensors")),
        load_file(str(fsdp_dpo / "model" / "model.safetensors")),
    )
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


# per_device 2, the same global batch of 8 on 2 ranks (2 micro-batches), on 1 (4) and on 4 (one): the micro-batch
# count comes from the environment, so the resume on 1 or 4 ranks is the same command (its changed config accepted as
# `ablate resume --force` accepts it)
RESHARD = [
    "distributed=fsdp",
    "method.args.per_device_train_batch_size=2",
    'method.args.gradient_accumulation_steps="${oc.decode:${oc.env:ABLATE_TEST_GA}}"',
    "+callbacks.kill._target_=crashing.KillAt",
]
SIX = ["method.args.max_steps=6", "method.args.logging_steps=1", "method.args.save_steps=2"]


@pytest.mark.parametrize("ranks", [1, 4])
def test_sharded_checkpoint_resumes_on_another_world_size(runs: Path, ranks: int) -> None:
    """Saved on 2 ranks (checkpoints 2 and 4, killed in step 5). On 1 rank the same command resumes
    from checkpoint-4's shards (DCP gathers both into the one rank); on 4, one of checkpoint-4's .distcp
    files is first cut in half: checkpoint-4 is passed over (its manifest no longer matches) and the
    run resumes from checkpoint-2's shards (DCP splits each in two). Both end with the uninterrupted
    2-rank run's losses and a loadable model/."""
    from transformers import AutoModelForCausalLM

    ref, run_dir = runs / "reshard_ref", runs / f"reshard_{ranks}"
    if not ref.is_dir():
        _torchrun(ref, *RESHARD, env=_env(ABLATE_TEST_GA="2"), steps=SIX)
    r = _torchrun(
        run_dir, *RESHARD, env=_env(ABLATE_TEST_GA="2", ABLATE_TEST_KILL_AT="5"), steps=SIX, check=False
    )
    assert r.returncode != 0 and list(run_dir.glob("killed.*"))
    if ranks == 4:
        shard = run_dir / "checkpoints" / "checkpoint-4" / "pytorch_model_fsdp_0" / "__1_0.distcp"
        os.truncate(shard, shard.stat().st_size // 2)
    r = _torchrun(
        run_dir,
        *RESHARD,
        env=_env(ABLATE_TEST_GA=str(8 // (2 * ranks)), ABLATE_ACCEPT_NEW_CONFIG="1"),
        steps=SIX,
        ranks=ranks,
    )
    out = r.stdout + r.stderr
    start = run_dir / "checkpoints" / ("checkpoint-2" if ranks == 4 else "checkpoint-4")
    assert f"resuming from {start}" in out, out[-3000:]
    assert ("skipping checkpoint-4: pytorch_model_fsdp_0/__1_0.distcp is truncated" in out) == (ranks == 4)
    assert json.loads((run_dir / "run.json").read_text())["world_size"] == ranks
    assert summary(run_dir)["status"] == "completed" and len(set(_losses(ref))) == 6
    assert _losses(run_dir) == pytest.approx(_losses(ref), rel=1e-5, abs=1e-6)
    assert {
        p.name for p in (run_dir / "checkpoints" / "checkpoint-6" / "pytorch_model_fsdp_0").glob("*.distcp")
    } == {f"__{k}_0.distcp" for k in range(ranks)}
    AutoModelForCausalLM.from_pretrained(run_dir / "model")


def test_ablate_resume_on_one_rank_keeps_the_global_batch(runs: Path) -> None:
    """The user's command: a run killed in step 5 on 2 ranks (accumulation 2), resumed by
    `torchrun --nproc_per_node=1 -m ablate resume RUN_DIR`: ablate sets accumulation 4 (one line says
    so), the config check accepts that change alone, and the run ends with the uninterrupted run's losses."""
    ref, run_dir = runs / "reshard_ref", runs / "resume_one_rank"
    if not ref.is_dir():
        _torchrun(ref, *RESHARD, env=_env(ABLATE_TEST_GA="2"), steps=SIX)
    r = _torchrun(
        run_dir, *RESHARD, env=_env(ABLATE_TEST_GA="2", ABLATE_TEST_KILL_AT="5"), steps=SIX, check=False
    )
    assert r.returncode != 0 and list(run_dir.glob("killed.*"))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=1",
            "-m",
            "ablate",
            "resume",
            str(run_dir),
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming on 1 rank(s), it ran on 2: method.args.gradient_accumulation_steps 2 -> 4" in r.stdout
    assert f"resuming from {run_dir / 'checkpoints' / 'checkpoint-4'}" in r.stdout + r.stderr
    assert json.loads((run_dir / "run.json").read_text())["world_size"] == 1
    assert summary(run_dir)["status"] == "completed"
    assert _losses(run_dir) == pytest.approx(_losses(ref), rel=1e-5, abs=1e-6)


# ---- two nodes: two torchrun agents meeting at a c10d rendezvous on loopback ----


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_node(agent: int) -> None:
    """SIGKILL a node: its torchrun agent and the workers it started (each in a session of its own)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == agent:
                os.kill(int(stat.parent.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue
    try:
        os.killpg(agent, signal.SIGKILL)
    except ProcessLookupError:
        pass


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def no_node_left() -> Iterator[None]:
    """A failing test leaves no node running (a stalled rank sleeps for 10 minutes)."""
    yield
    while STARTED:
        p = STARTED.pop()
        if p.poll() is None:
            _kill_node(p.pid)
            p.communicate()


def _node(cwd: Path, port: int, *overrides: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """One 'node': its own torchrun agent and working dir, 1 rank; the run dir is given explicitly
    (on a real cluster: a path on the shared filesystem), so both nodes name the same one."""
    cwd.mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc_per_node=1",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}",
            "--rdzv_id=ablate_test",
            "-m",
            "ablate",
            "train",
            "method.args.use_cpu=true",
            *STEPS,
            *overrides,
        ],
        cwd=cwd,
        env=env or _env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # its own process group: the test can kill the whole node
    STARTED.append(p)
    return p


def _wait(p: subprocess.Popen, timeout: float = TIMEOUT) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_node(p.pid)
        out, err = p.communicate()
        pytest.fail(f"node did not finish within {timeout} s: {err[-3000:]}")
    return p.returncode, out, err


def test_two_nodes_equal_one_node_and_write_one_run_dir(tmp_path: Path, ddp_dpo: Path) -> None:
    run_dir, port = tmp_path / "shared" / "run", _free_port()
    nodes = [_node(tmp_path / f"node{i}", port, f"hydra.run.dir={run_dir}") for i in range(2)]
    results = [_wait(p) for p in nodes]
    for rc, _, err in results:
        assert rc == 0, err[-3000:]
    assert sum(out.count("run dir:") for _, out, _ in results) == 1  # global rank 0 alone reports
    assert json.loads((run_dir / "run.json").read_text())["world_size"] == 2
    assert _losses(run_dir) == pytest.approx(_losses(ddp_dpo), rel=1e-5, abs=1e-6)
    for i in range(2):  # nothing was written relative to either node's working dir
        assert list((tmp_path / f"node{i}").iterdir()) == []


def test_a_killed_node_ends_the_other_quickly_and_the_run_resumes(tmp_path: Path, ddp_dpo: Path) -> None:
    """Global rank 1 stops after step 3 (checkpoint-2 written), rank 0 waits for it in step 4; then rank 1's
    node (agent and worker) is SIGKILLed: rank 0's node ends within seconds with one error line, not at
    the group timeout; the same two commands again resume from checkpoint-2 to the 2-rank losses."""
    run_dir, port = tmp_path / "shared" / "run", _free_port()
    args = [
        f"hydra.run.dir={run_dir}",
        "distributed.ddp_timeout=120",
        "+callbacks.stall._target_=crashing.StallAt",
    ]
    nodes = [_node(tmp_path / f"node{i}", port, *args, env=_env(ABLATE_TEST_STALL_AT="3")) for i in range(2)]
    deadline = time.time() + TIMEOUT
    while not list(run_dir.glob("stalled.*")):
        assert time.time() < deadline and all(p.poll() is None for p in nodes), [
            p.communicate()[1][-2000:] for p in nodes
        ]
        time.sleep(0.5)
    worker = int(next(run_dir.glob("stalled.*")).suffix[1:])  # rank 1; its parent is its node's agent
    agent = int(Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[1])
    victim = next(p for p in nodes if p.pid == agent)
    survivor = next(p for p in nodes if p is not victim)
    time.sleep(2.0)  # rank 0 is in step 4's first collective by now
    _kill_node(agent)  # the node's crash
    killed = time.time()
    rc, out, err = _wait(survivor, timeout=150)
    took = time.time() - killed
    victim.communicate()
    assert rc != 0 and took < 60, (took, err[-3000:])  # a dead peer resets its connections: no timeout wait
    assert err.count("ablate: error:") == 1 and "resume" in err, err[-3000:]
    assert (run_dir / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file()
    for f in run_dir.glob("stalled.*"):
        f.unlink()
    nodes = [_node(tmp_path / f"node{i}", port, *args) for i in range(2)]
    for rc, _, err in (_wait(p) for p in nodes):
        assert rc == 0, err[-3000:]
    assert summary(run_dir)["status"] == "completed" and summary(run_dir)["global_step"] == 4
    assert _losses(run_dir) == pytest.approx(_losses(ddp_dpo), rel=1e-5, abs=1e-6)


def test_two_nodes_without_a_shared_run_dir_are_refused(tmp_path: Path) -> None:
    """Each node's default run dir is under its own working dir: the ranks would write a run that cannot
    resume (a checkpoint's files split over two dirs). Refused on every rank in one line, before any model."""
    port = _free_port()
    env = _env(
        ABLATE_LAUNCH_TIME=str(time.time())
    )  # the documented way to share the launch time; not the dir
    nodes = [_node(tmp_path / f"node{i}", port, env=env) for i in range(2)]
    for rc, _, err in (_wait(p) for p in nodes):
        assert rc != 0 and err.count("ablate: error: the ranks name different run dirs") == 1, err[-3000:]
        assert "same hydra.run.dir" in err
