"""`ablate sweep NAME --dry-run [overrides]`: the jobs a launch would start (overrides, run dir names,
count, launcher), as a user runs it from their own cwd with default dirs; nothing is started or created."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import ablate

FAST = ["method.args.max_steps=1", "method.args.save_strategy=no"]
JOB = re.compile(r"^job (\d+): (.*) -> (.+)$")


def _plan(stdout: str) -> tuple[str, list[tuple[set[str], Path]]]:
    """The launcher and, per job in order, its overrides and run dir, from the dry run's output."""
    head = re.search(r"^dry run of sweep \S+: (\d+) job\(s\), launcher (.+); nothing started$", stdout, re.M)
    assert head, stdout
    jobs = []
    for num, line in enumerate(m for m in map(JOB.match, stdout.splitlines()) if m):
        assert int(line.group(1)) == num
        jobs.append((set(line.group(2).split()), Path(line.group(3))))
    assert len(jobs) == int(head.group(1)), stdout
    return head.group(2), jobs


def test_dry_run_lists_every_job_and_starts_nothing(tmp_path):
    r = ablate("sweep", "dpo_loss", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    launcher, jobs = _plan(r.stdout)
    assert launcher.startswith("basic (hydra._internal.core_plugins.basic_launcher.BasicLauncher)")
    # the sweep config's hydra.sweeper.params: 2 losses x 3 seeds, in Hydra's order
    assert [o - {"+sweep=dpo_loss"} for o, _ in jobs] == [
        {f"method/dpo_loss={loss}", f"seed={seed}"} for loss in ("sigmoid", "hinge") for seed in (1, 2, 3)
    ]
    assert [d.name[:-9] for _, d in jobs] == [
        f"{n}_dpo_loss-{loss}_seed-{seed}"
        for n, (loss, seed) in enumerate((lo, s) for lo in ("sigmoid", "hinge") for s in (1, 2, 3))
    ]
    assert all(re.fullmatch(r"-[0-9a-f]{8}", d.name[-9:]) for _, d in jobs)  # the overrides' hash
    assert all(d.parent.parent == Path("outputs/sweeps/dpo_loss") for _, d in jobs)
    assert list(tmp_path.iterdir()) == []  # no outputs/, no run dir, no .hydra/


def test_command_line_override_shrinks_the_dry_run_and_a_launcher_is_named(tmp_path):
    r = ablate("sweep", "dpo_loss", "--dry-run", "seed=0", "hydra/launcher=local_parallel", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    launcher, jobs = _plan(r.stdout)
    assert launcher.startswith("local_parallel (") and "JoblibLauncher" in launcher
    assert [o for o, _ in jobs] == [
        {"+sweep=dpo_loss", "method/dpo_loss=sigmoid", "seed=0"},
        {"+sweep=dpo_loss", "method/dpo_loss=hinge", "seed=0"},
    ]
    assert list(tmp_path.iterdir()) == []


def test_dry_run_names_the_dirs_a_real_launch_creates(tmp_path):
    args = ["sweep", "dpo_loss", "seed=0", *FAST]
    dry = ablate(*args, "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr[-3000:]
    _, jobs = _plan(dry.stdout)
    assert not (tmp_path / "outputs").exists()
    real = ablate(*args, cwd=tmp_path)
    assert real.returncode == 0, real.stderr[-3000:]
    launches = list((tmp_path / "outputs" / "sweeps" / "dpo_loss").iterdir())
    assert len(launches) == 1
    created = sorted(p.name for p in launches[0].iterdir() if p.is_dir() and p.name[0].isdigit())
    assert created == ["0_dpo_loss-sigmoid-9ed88e63", "1_dpo_loss-hinge-d73de010"]
    assert created == [d.name for _, d in jobs]  # the same names (the date-time part is when each ran)
    assert all(d.parent.parent == launches[0].relative_to(tmp_path).parent for _, d in jobs)


def test_dry_run_imports_no_torch(tmp_path):
    code = (
        "import sys; from ablate.cli import main; main(['sweep', 'dpo_loss', '--dry-run']); "
        "print('torch imported' if 'torch' in sys.modules else 'no torch')"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[-1] == "no torch"


def test_both_entry_points_name_jobs_alike_and_resume_finds_them(tmp_path):
    """A sweep launched as `ablate train -m +sweep=dpo_loss <fixed keys>` (issue 10): its job dirs
    leave out the fixed keys and the labels, exactly as `ablate sweep dpo_loss <fixed keys>` names
    them, so `ablate sweep dpo_loss <same keys> --resume` finds every job and skips it (before the
    fix it launched them again into new dirs named without the fixed keys)."""
    fixed = ["seed=1", *FAST, "tags=[baseline]", "notes=why not"]
    r = ablate("train", "-m", "+sweep=dpo_loss", *fixed, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (launch,) = list((tmp_path / "outputs" / "sweeps" / "dpo_loss").iterdir())
    names = sorted(p.name for p in launch.iterdir() if p.is_dir() and p.name[0].isdigit())
    assert names == ["0_dpo_loss-sigmoid-9ed88e63", "1_dpo_loss-hinge-d73de010"]

    dry = ablate("sweep", "dpo_loss", *fixed, "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert [d.name for _, d in _plan(dry.stdout)[1]] == names  # `ablate sweep` names them the same

    steps = {n: (launch / n / "summary.json").read_text() for n in names}
    again = ablate("sweep", "dpo_loss", *fixed, "--resume", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming {launch.resolve()}: 2 skipped" in again.stdout
    assert (
        sorted(p.name for p in launch.iterdir() if p.is_dir() and p.name[0].isdigit()) == names
    )  # no new job dir
    assert {n: (launch / n / "summary.json").read_text() for n in names} == steps  # completed jobs untouched
