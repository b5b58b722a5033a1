"""Resuming a sweep (`ablate sweep NAME --resume`), as a user runs it: default sweep dir, from a
fresh cwd. A sweep killed with SIGKILL at a random moment and resumed ends with the same per-job
metrics as an uninterrupted one; a sweep with one poisoned job, fixed and resumed, runs only that
job; a changed sweep config is refused with one line naming the key, or started fresh with --force.

Run with `python -m pytest -m slow tests/slow/test_sweep_resume.py` (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
ENV = {
    **os.environ,
    "COLUMNS": "250",
    "WANDB_MODE": "disabled",
    "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
}
COMMON = ["method.args.max_steps=6", "method.args.save_steps=2", "method.args.logging_steps=1"]
# what a job learned (train_runtime, train_loss etc. describe the last train() call, not the run)
LEARNED = [
    "loss",
    "grad_norm",
    "rewards/margins",
    "rewards/accuracies",
    "rewards/chosen",
    "rewards/rejected",
    "logps/chosen",
    "logps/rejected",
    "num_input_tokens_seen",
]


def start(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "ablate", *args],
        cwd=cwd,
        env={**ENV, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = start(args, cwd, env)
    out, err = proc.communicate(timeout=900)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def the_sweep_dir(cwd: Path) -> Path:
    (sweep,) = (cwd / "outputs" / "sweeps" / "dpo_loss").iterdir()  # one launch, resumed in place
    return sweep


def jobs(sweep: Path) -> dict[str, Path]:
    return {p.name: p for p in sweep.iterdir() if p.is_dir() and p.name[0].isdigit()}


def learned(job: Path) -> tuple[dict, list]:
    summary = json.loads((job / "summary.json").read_text())
    events = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    return {k: summary["metrics"][k] for k in LEARNED}, [
        (e["step"], e["loss"]) for e in events if "loss" in e
    ]


def logged_steps(cwd: Path) -> int:
    """Training steps logged so far by every job of the sweep under cwd (a sweep's progress clock)."""
    n = 0
    for metrics in cwd.glob("outputs/sweeps/dpo_loss/*/*/metrics.jsonl"):
        try:
            n += sum('"loss"' in line for line in metrics.read_text().splitlines())
        except OSError:  # being written
            pass
    return n


def test_killed_sweep_resumes_to_the_uninterrupted_metrics(tmp_path: Path) -> None:
    ref = run(["sweep", "dpo_loss", *COMMON], tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr[-3000:]

    # The kill is aimed by progress, not by wall time (a loaded CI machine made a timed kill land
    # after the sweep had ended): SIGKILL once a random number of the sweep's 36 steps are logged,
    # i.e. mid-job, between checkpoints or right after one, in any of the first five jobs.
    seed = random.randrange(1 << 30)
    target = random.Random(seed).randint(1, 30)
    proc = start(["sweep", "dpo_loss", *COMMON], tmp_path / "run")
    while proc.poll() is None and logged_steps(tmp_path / "run") < target:
        time.sleep(0.02)
    assert proc.poll() is None, f"sweep ended before step {target} was logged (random seed {seed})"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kill_at = f"{logged_steps(tmp_path / 'run')} steps logged, target {target}"
    sweep = the_sweep_dir(tmp_path / "run")
    done = sum(
        (j / "summary.json").is_file()
        and json.loads((j / "summary.json").read_text())["status"] == "completed"
        for j in jobs(sweep).values()
    )
    assert done < 6, f"kill at {kill_at} (seed {seed})"

    resumed = run(["sweep", "dpo_loss", *COMMON, "--resume"], tmp_path / "run")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "6/6 jobs completed" in resumed.stdout and "this launch" in resumed.stdout
    assert resumed.stdout.count("skipped") >= done, resumed.stdout[-3000:]
    assert the_sweep_dir(tmp_path / "run") == sweep  # resumed in place, no second launch dir
    expected = jobs(the_sweep_dir(tmp_path / "ref"))
    got = jobs(sweep)
    assert sorted(got) == sorted(expected)
    for name in expected:
        (m_ref, curve_ref), (m_got, curve_got) = learned(expected[name]), learned(got[name])
        assert curve_got == curve_ref, f"{name}: kill at {kill_at} (seed {seed})"
        assert m_got == pytest.approx(m_ref, rel=1e-6), name


def test_poisoned_job_fixed_and_resumed_runs_only_that_job_and_changed_configs_are_refused(
    tmp_path: Path,
) -> None:
    own = (
        tmp_path / "mine" / "dpo2.yaml"
    )  # a sweep file of the user's own (any folder), edited between launches
    own.parent.mkdir(parents=True)
    own.write_text((REPO / "sweeps" / "dpo_loss.yaml").read_text())
    args = [
        "sweep",
        str(own),
        "seed=1,2",
        "method/dpo_loss=sigmoid",
        "method.args.max_steps=4",
        "method.args.save_steps=2",
        "method.args.logging_steps=1",
        "+callbacks.crash._target_=crashing.CrashAt",
    ]
    cwd = tmp_path / "work"
    poisoned = run(args, cwd, env={"ABLATE_TEST_CRASH_AT": "3", "ABLATE_TEST_CRASH_SEED": "2"})
    assert poisoned.returncode != 0 and "1/2 jobs completed" in poisoned.stdout
    sweep = the_sweep_dir(cwd)
    ok, bad = (
        jobs(sweep)["0_dpo_loss-sigmoid_seed-1-9b615bfa"],
        jobs(sweep)["1_dpo_loss-sigmoid_seed-2-f7f5db2c"],
    )
    kept = (
        "summary.json",
        "metrics.jsonl",
        "run.json",
        "model",
        "checkpoints",
    )  # Hydra's log and .hydra/ do change
    before = {p.name: p.stat().st_mtime_ns for p in ok.iterdir() if p.name in kept}

    fixed = run([*args, "--resume"], cwd)  # the poison (the environment) is gone
    assert fixed.returncode == 0, fixed.stdout[-3000:] + fixed.stderr[-3000:]
    assert "resuming" in fixed.stdout and "1 skipped, 1 resumed" in fixed.stdout
    row = {line.split("│")[1].strip(): line for line in fixed.stdout.splitlines() if line.startswith("│")}
    assert (
        "skipped" in row["0"]
        and "resumed from step 2 (failed)" in row["1"]
        and "2/2 jobs completed" in fixed.stdout
    )
    assert {p.name: p.stat().st_mtime_ns for p in ok.iterdir() if p.name in kept} == before  # not run again
    events = [json.loads(line) for line in (bad / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if "loss" in e] == [1, 2, 3, 4]  # step 3 (crashed) logged once

    own.write_text(own.read_text().replace("beta: 0.1 ", "beta: 0.2 "))
    refused = run([*args, "--resume"], cwd)
    assert refused.returncode == 2 and refused.stdout.count("│") == 0  # no job ran
    assert refused.stderr.strip().count("\n") == 0, refused.stderr  # one line
    assert (
        "job 0 (0_dpo_loss-sigmoid_seed-1-9b615bfa) changed since it ran: method.args.beta (was 0.1, now 0.2)"
        in refused.stderr
    )
    forced = run([*args, "--resume", "--force"], cwd)
    assert forced.returncode == 0 and forced.stdout.count("new (--force: changed)") == 2
    assert len(list((sweep / ".replaced").iterdir())) == 2
    assert json.loads((ok / "run.json").read_text())["config"]["method"]["args"]["beta"] == 0.2
