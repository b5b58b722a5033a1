"""Run-dir ownership and resume edge cases (issue 12): a completed run never changes, one process
per run dir, only empty or ablate dirs are used, a corrupt newest checkpoint is skipped, the record
is right after resumes and signals, --config-dir runs resume."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, TESTS, ablate, metrics, summary

FAST = [
    "method.args.max_steps=6",
    "method.args.save_steps=2",
    "method.args.logging_steps=1",
    "+callbacks.crash._target_=crashing.CrashAt",
    "+callbacks.crash_end._target_=crashing.CrashAtEnd",
]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _losses(run_dir: Path) -> list[tuple[int, float]]:
    return [(e["step"], e["loss"]) for e in metrics(run_dir) if "loss" in e]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("ref") / "run"
    r = ablate("train", *FAST, f"hydra.run.dir={run_dir}")
    assert r.returncode == 0, r.stderr[-3000:]
    return run_dir


def test_completed_run_is_never_trained_further(uninterrupted):
    """Defect 1: rerunning a completed run's command, or resuming it, says so and changes nothing."""
    model = uninterrupted / "model" / "model.safetensors"
    before = (
        _sha(model),
        model.stat().st_mtime_ns,
        (uninterrupted / "metrics.jsonl").read_text(),
        (uninterrupted / "summary.json").read_text(),
    )
    again = ablate("train", *FAST, f"hydra.run.dir={uninterrupted}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already completed at step 6" in again.stdout
    resumed = ablate("resume", str(uninterrupted))
    assert resumed.returncode == 0 and "already completed" in resumed.stdout
    after = (
        _sha(model),
        model.stat().st_mtime_ns,
        (uninterrupted / "metrics.jsonl").read_text(),
        (uninterrupted / "summary.json").read_text(),
    )
    assert after == before


def test_completed_run_never_changes_a_byte(uninterrupted, tmp_path):
    """Issue 22 item 6: rerunning a completed run rewrote `.lock` and `.hydra/*` (new content from
    another cwd, with reordered overrides, `hydra.verbose=true` or `-m`). Every path under the run
    dir keeps its bytes and its mtime, whichever way the run is rerun."""
    before = _snapshot(uninterrupted)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    reruns = {
        "another cwd": ("train", *FAST, f"hydra.run.dir={uninterrupted}"),
        "reordered overrides": ("train", *reversed(FAST), f"hydra.run.dir={uninterrupted}"),
        "hydra.verbose": ("train", *FAST, f"hydra.run.dir={uninterrupted}", "hydra.verbose=true"),
        "-m": (
            "train",
            "-m",
            *FAST,
            f"hydra.sweep.dir={uninterrupted.parent}",
            f"hydra.sweep.subdir={uninterrupted.name}",
        ),
        "resume": ("resume", str(uninterrupted)),
    }
    for how, args in reruns.items():
        r = ablate(*args, cwd=elsewhere)
        assert r.returncode == 0, (how, r.stderr[-3000:])
        assert "already completed at step 6" in r.stdout, (how, r.stdout[-2000:])
        assert _snapshot(uninterrupted) == before, how


def test_crash_after_final_checkpoint_finishes_without_another_step(tmp_path, uninterrupted):
    """Defect 1: killed between the final checkpoint and summary.json, a resume only saves."""
    crashed = ablate("train", *FAST, f"hydra.run.dir={tmp_path}", env={"ABLATE_TEST_CRASH_AT_END": "1"})
    assert crashed.returncode != 0 and summary(tmp_path)["status"] == "failed"
    assert (tmp_path / "checkpoints" / "checkpoint-6").is_dir() and not (tmp_path / "model").exists()
    r = ablate("resume", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    s = summary(tmp_path)
    assert s["status"] == "completed" and s["global_step"] == 6
    assert _losses(tmp_path) == _losses(uninterrupted)  # no step 7, nothing logged twice
    assert _sha(tmp_path / "model" / "model.safetensors") == _sha(
        uninterrupted / "model" / "model.safetensors"
    )
    assert s["metrics"]["train_loss"] == pytest.approx(
        summary(uninterrupted)["metrics"]["train_loss"], abs=1e-9
    )


def test_second_process_in_run_dir_is_refused(tmp_path):
    """Defect 2: the run dir is locked for the run's life; the holder is named in one line."""
    tmp_path.mkdir(exist_ok=True)
    fd = os.open(tmp_path / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running ablate process holds it
    os.write(fd, b"PID 4242 on host otherbox\n")
    try:
        r = ablate("train", "method.args.max_steps=2", f"hydra.run.dir={tmp_path}")
    finally:
        os.close(fd)
    assert r.returncode != 0
    assert "in use by PID 4242 on host otherbox" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    # refused before Hydra writes anything into the dir in use
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]


def test_two_processes_started_together_in_one_dir(tmp_path):
    """Defect 2, as users hit it: both started at once; exactly one trains, the other is refused."""
    cmd = [
        sys.executable,
        "-m",
        "ablate",
        "train",
        "method.args.max_steps=30",
        "method.args.logging_steps=1",
        f"hydra.run.dir={tmp_path}",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes[0] == 0 and codes[1] != 0, outs
    refused = outs[[p.returncode for p in procs].index(codes[1])][1]
    assert "is in use by PID" in refused
    steps = [e["step"] for e in metrics(tmp_path) if "loss" in e]
    assert steps == list(range(1, 31))  # every step logged once


def test_default_run_dirs_started_together_are_distinct(tmp_path):
    """Defect 2: default dir names have sub-second time, so runs launched in one second do not meet."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        "-m",
        "ablate",
        "train",
        "method.args.max_steps=2",
        "method.args.logging_steps=1",
        "method.args.save_strategy=no",
    ]
    procs = [
        subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    dirs = [p.parent for p in tmp_path.glob("outputs/runs/*/*/summary.json")]
    assert len(dirs) == 3
    for d in dirs:
        assert summary(d)["status"] == "completed" and [e["step"] for e in metrics(d) if "loss" in e] == [
            1,
            2,
        ]


def _snapshot(d: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every path under `d` with its bytes (None for a dir) and mtime: to show a dir was not touched."""
    return {
        str(p.relative_to(d)): (None if p.is_dir() else p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted([d, *d.rglob("*")])
    }


def test_foreign_dir_is_refused_untouched(tmp_path):
    """Defect 3: a non-empty dir without run.json is someone else's: refused in one line before Hydra
    writes .hydra/ or ablate.log into it; listing, bytes and mtimes are as they were."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").write_bytes(b"user weights")
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "metrics.jsonl").write_text('{"mine": 1}\n')
    before = _snapshot(tmp_path)
    r = ablate("train", "method.args.max_steps=2", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 2 and "holds no ablate run" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("ablate: error: "), r.stderr
    assert _snapshot(tmp_path) == before  # no .hydra/, no ablate.log, nothing rewritten


def test_other_runs_dir_is_refused_untouched(tmp_path):
    """A run dir holding another run (other overrides) is refused before Hydra rewrites its .hydra/."""
    assert (
        ablate(
            "train", "method.args.max_steps=2", "method.args.save_strategy=no", f"hydra.run.dir={tmp_path}"
        ).returncode
        == 0
    )
    before = _snapshot(tmp_path)
    r = ablate(
        "train", "method.args.max_steps=3", "method.args.save_strategy=no", f"hydra.run.dir={tmp_path}"
    )
    assert r.returncode == 2 and "holds another run" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert _snapshot(tmp_path) == before


def test_corrupt_run_json_is_refused(tmp_path):
    """Defect 3: a corrupt run.json is refused by train and resume, never taken for a fresh dir."""
    assert ablate("train", "method.args.max_steps=2", f"hydra.run.dir={tmp_path}").returncode == 0
    (tmp_path / "run.json").write_text('{"overrides": [')
    before = (tmp_path / "summary.json").read_text()
    r = ablate("train", "method.args.max_steps=2", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 2 and "run.json is corrupt" in r.stderr and "Traceback" not in r.stderr
    r = ablate("resume", str(tmp_path))
    assert r.returncode == 2 and "run.json is corrupt" in r.stderr
    assert (tmp_path / "summary.json").read_text() == before


@pytest.mark.parametrize("corrupt", ["trainer_state.json", "model.safetensors"])
def test_corrupt_newest_checkpoint_falls_back(tmp_path, uninterrupted, corrupt):
    """Defect 5: a truncated file in the newest checkpoint: resume from the one before, say which."""
    crashed = ablate("train", *FAST, f"hydra.run.dir={tmp_path}", env={"ABLATE_TEST_CRASH_AT": "5"})
    assert crashed.returncode != 0
    target = tmp_path / "checkpoints" / "checkpoint-4" / corrupt
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    r = ablate("resume", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "skipping checkpoint-4" in out and "resuming from checkpoint-2" in out
    assert _losses(tmp_path) == _losses(uninterrupted)
    s = summary(tmp_path)
    assert s["status"] == "completed"
    # defect 6: train_loss covers the whole run (Trainer's own counts only the steps since the resume)
    assert s["metrics"]["train_loss"] == pytest.approx(
        summary(uninterrupted)["metrics"]["train_loss"], rel=1e-9
    )


def test_kill_before_first_checkpoint_logs_each_step_once(tmp_path, uninterrupted):
    """Defect 6: a kill before the first checkpoint does not leave its steps twice in metrics.jsonl."""
    assert (
        ablate("train", *FAST, f"hydra.run.dir={tmp_path}", env={"ABLATE_TEST_CRASH_AT": "2"}).returncode != 0
    )
    assert [s for s, _ in _losses(tmp_path)] == [1] and not list(tmp_path.glob("checkpoints/checkpoint-*"))
    r = ablate("resume", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert _losses(tmp_path) == _losses(uninterrupted)  # each step once, same values
    ref = summary(uninterrupted)["metrics"]["train_loss"]
    assert summary(tmp_path)["metrics"]["train_loss"] == pytest.approx(ref, rel=1e-9)


def test_sigterm_records_interrupted(tmp_path):
    """Defect 6: SIGTERM (docker stop, timeout) ends the run `interrupted`, summary written, exit 143;
    a resume then completes it."""
    cmd = [
        sys.executable,
        "-m",
        "ablate",
        "train",
        "method.args.max_steps=100000",
        "method.args.logging_steps=1",
        "method.args.save_steps=20",
        "method.args.save_total_limit=1",
        f"hydra.run.dir={tmp_path}",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not list(
        (tmp_path / "checkpoints").glob("checkpoint-*/trainer_state.json")
    ):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "interrupted" in err
    s = summary(tmp_path)
    assert s["status"] == "interrupted" and s["error"] == "SIGTERM" and "wall_seconds" in s
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["overrides"][0] == "method.args.max_steps=100000"


def test_resume_of_config_dir_run(tmp_path):
    """Defect 8: a run started with --config-dir (and PYTHONPATH for its code) resumes from its dir
    alone: run.json records both."""
    example = ROOT / "examples" / "hinge_subclass"
    base = os.environ.get("PYTHONPATH", "")  # where ablate itself comes from (a checkout's src/)
    env = {"PYTHONPATH": os.pathsep.join([str(example), str(TESTS), base])}
    crashed = ablate(
        "train",
        "--config-dir",
        str(example),
        "method=my_hinge",
        *FAST,
        f"hydra.run.dir={tmp_path}",
        env={**env, "ABLATE_TEST_CRASH_AT": "3"},
    )
    assert crashed.returncode != 0 and "simulated crash at step 3" in summary(tmp_path)["error"]
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["config_dir"] == str(example) and str(example) in info["pythonpath"]
    r = ablate(
        "resume", str(tmp_path), env={"PYTHONPATH": os.pathsep.join([str(TESTS), base])}
    )  # neither again
    assert r.returncode == 0, r.stderr[-3000:]
    s = summary(tmp_path)
    assert s["status"] == "completed" and s["global_step"] == 6 and s["method"] == "my_hinge"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm_parent", "ctrl_c_group"])
def test_stopping_local_parallel_sweep_stops_workers(tmp_path, how):
    """Defect 9: SIGTERM to a local_parallel sweep's parent (docker stop, kill), or Ctrl-C in its
    terminal (SIGINT to the process group), stops every worker; each job records `interrupted`."""
    import psutil

    cmd = [
        sys.executable,
        "-m",
        "ablate",
        "train",
        "-m",
        "hydra/launcher=local_parallel",
        "seed=1,2",
        "method.args.max_steps=100000",
        "method.args.logging_steps=1",
        "method.args.save_steps=10",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 400
    jobs: list[Path] = []
    while time.time() < deadline:
        jobs = [p.parent for p in tmp_path.glob("outputs/sweeps/multirun/*/*/metrics.jsonl")]
        if len(jobs) == 2 and all(p.stat().st_size for p in (j / "metrics.jsonl" for j in jobs)):
            break
        time.sleep(0.5)
    assert len(jobs) == 2, "both jobs should be training"
    workers = psutil.Process(proc.pid).children(recursive=True)
    if how == "sigterm_parent":
        proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == (143 if how == "sigterm_parent" else 130), err[-3000:]
    # issue 32: one line for the sweep (each worker said it too, loky's tracker warned of leaked semaphores)
    said = [
        line
        # a worker's progress bar killed mid-line has no newline: the parent's line follows it on the same line
        for line in re.sub(r"(?<=[^\n])(?=ablate: )", "\n", err.replace("\r", "\n")).splitlines()
        if line.strip() and "it/s" not in line and not line.startswith("Reference log-probs")
    ]
    assert len(said) == 1 and said[0].startswith("ablate: interrupted ("), said
    gone, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, [p.cmdline() for p in alive]
    for job in jobs:
        s = summary(job)
        assert s["status"] == "interrupted", (job, s)


def test_minor_items(tmp_path):
    """Defect 10: no pin_memory warning on a CPU run; model.safetensors gets the mode of every other
    file (not 0600); `ablate compare` calls a corrupt summary.json unreadable, not running. (`ablate
    sweep` from any dir: the shipped sweep files resolve by name, sweeps/.)"""
    run_dir = tmp_path / "run"
    r = ablate("train", "method.args.max_steps=2", "method.args.save_strategy=no", f"hydra.run.dir={run_dir}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "pin_memory" not in r.stderr
    modes = {p.name: p.stat().st_mode & 0o777 for p in (run_dir / "model").iterdir()}
    assert (
        modes["model.safetensors"]
        == modes["config.json"]
        == (run_dir / "summary.json").stat().st_mode & 0o777
    )
    (run_dir / "summary.json").write_text('{"status": "compl')
    r = ablate("compare", str(run_dir), env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "unreadable" in r.stdout and "running" not in r.stdout


def test_cfg_job_imports_neither_torch_nor_datasets(tmp_path):
    """`ablate train --cfg job` composes and prints without importing torch or datasets (~1 s)."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ablate", "train", "--cfg", "job"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "method:" in r.stdout, r.stderr[-3000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines() if "|" in line}
    assert {"ablate", "hydra"} <= imported  # the import log is what it should be
    assert not imported & {"torch", "datasets", "transformers"}, sorted(
        imported & {"torch", "datasets", "transformers"}
    )


def test_one_line_error_keeps_its_cause_in_ablate_log(tmp_path):
    """A loading error the user sees as one line still has its whole cause chain in the run's log."""
    r = ablate("train", "model=qwen2_5_0_5b", f"hydra.run.dir={tmp_path}", env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and "model.path: cannot load" in r.stderr and "Traceback" not in r.stderr
    log = (tmp_path / "ablate.log").read_text()
    assert "run failed: ConfigError: model.path: cannot load" in log
    assert "Traceback" in log and "The above exception was the direct cause" in log  # the OSError behind it


def test_resume_on_another_rank_count_keeps_the_global_batch_or_says_why_not(tmp_path):
    """A run of 2 ranks (torchrun, SLURM tasks) x gradient_accumulation_steps 1 resumed by `ablate resume`
    in one process: accumulation 2 keeps its global batch (said in one line, the override added; here it
    then fails on the fake overrides, past the check). Ran with accumulation 1 on 2 ranks, 4 ranks cannot
    keep it: refused in one line naming what works. The same dir recorded as 1 process: nothing added."""
    run_dir = tmp_path / "14-00-00_seed=1"
    run_dir.mkdir()
    info = {
        "overrides": ["seed=1", "+no_such_key=1"],
        "world_size": 2,
        "config": {"method": {"args": {"gradient_accumulation_steps": 1}}},
    }
    (run_dir / "run.json").write_text(json.dumps(info))
    (run_dir / "summary.json").write_text(json.dumps({"status": "failed"}))
    r = ablate("resume", str(run_dir), cwd=tmp_path)
    assert "resuming on 1 rank(s), it ran on 2: method.args.gradient_accumulation_steps 1 -> 2" in r.stdout, (
        r.stderr
    )
    assert "method.args.gradient_accumulation_steps=2" in r.stdout + r.stderr  # the command it runs
    assert "no_such_key" in r.stdout + r.stderr
    r = ablate("resume", str(run_dir), cwd=tmp_path, env={"WORLD_SIZE": "4"})
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]  # one line
    assert (
        "4 ranks cannot keep that global batch" in r.stderr and "resume on a divisor of 2 ranks" in r.stderr
    )
    assert "Traceback" not in r.stderr
    (run_dir / "run.json").write_text(json.dumps({**info, "world_size": 1}))
    r = ablate("resume", str(run_dir), cwd=tmp_path)
    assert "resuming on" not in r.stdout and "gradient_accumulation_steps=" not in r.stdout + r.stderr
    assert "no_such_key" in r.stdout + r.stderr


def test_resume_refused_under_torchrun_is_said_once(tmp_path):
    """`torchrun --nproc_per_node=3 -m ablate resume RUN` on a 2-rank run (accumulation 1): the refusal is
    said once, by rank 0, and the other ranks leave first (exit 0), so torchrun reports one failed process,
    not one killed by SIGTERM per rank (its own traceback and summary of that failure no child can silence)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    info = {
        "overrides": ["seed=1"],
        "world_size": 2,
        "config": {"method": {"args": {"gradient_accumulation_steps": 1}}},
    }
    (run_dir / "run.json").write_text(json.dumps(info))
    (run_dir / "summary.json").write_text(json.dumps({"status": "failed"}))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=3",
            "-m",
            "ablate",
            "resume",
            str(run_dir),
        ],
        cwd=tmp_path,
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0
    said = [line for line in r.stderr.splitlines() if line.startswith("ablate: error: ")]
    assert len(said) == 1 and "3 ranks cannot keep that global batch" in said[0], r.stderr[-3000:]
    assert r.stderr.count("exitcode  :") == 1 and "SIGTERM" not in r.stderr, r.stderr[-3000:]
    assert "rank      : 0 (local_rank: 0)" in r.stderr and "<NO_OTHER_FAILURES>" in r.stderr, r.stderr[-3000:]


def test_resume_on_edited_data_is_refused_in_one_line(tmp_path):
    """Issue 22 item 9: a data file edited between the kill and the resume resumed silently on other
    data. run.json records the data's fingerprint; a resume on changed data is refused in one line
    naming the way to accept it (`ablate resume RUN_DIR --force`), which then completes the run."""
    data = tmp_path / "prefs.jsonl"
    shipped = ROOT / "src" / "ablate" / "data" / "tiny" / "sort_prefs_train.jsonl"
    data.write_text(shipped.read_text())
    run_dir = tmp_path / "run"
    args = ["data=jsonl", f"data.train_path={data}", *FAST, f"hydra.run.dir={run_dir}"]
    crashed = ablate("train", *args, env={"ABLATE_TEST_CRASH_AT": "5"})
    assert crashed.returncode != 0 and (run_dir / "checkpoints" / "checkpoint-4").is_dir()
    recorded = json.loads((run_dir / "run.json").read_text())["data"]
    assert recorded["train"]["rows"] == len(shipped.read_text().splitlines()) and recorded["eval"] is None
    rows = data.read_text().splitlines()
    first = json.loads(rows[0])
    rows[0] = json.dumps(
        {**first, "chosen": first["rejected"], "rejected": first["chosen"]}
    )  # one pair flipped
    data.write_text("\n".join(rows) + "\n")
    refused = ablate("resume", str(run_dir))
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines() == [
        f"ablate: error: the train data changed since this run started ({len(rows)} rows, other content; run.json "
        f"records its sha256); restore it, or resume on the new data: ablate resume {run_dir} --force"
    ]
    assert not [p for p in (run_dir / "checkpoints").glob("checkpoint-*") if int(p.name.split("-")[1]) > 4]
    again = ablate("train", *args)  # the same command again: refused the same way
    assert again.returncode == 2 and "--force" in again.stderr
    forced = ablate("resume", str(run_dir), "--force")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert "the train data changed since this run started" in forced.stdout + forced.stderr
    assert summary(run_dir)["status"] == "completed" and summary(run_dir)["global_step"] == 6
    assert json.loads((run_dir / "run.json").read_text())["data"]["train"] != recorded["train"]
