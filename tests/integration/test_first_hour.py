"""The first hour of a new user, again (issue 23): each test walks a user's path from a scratch dir
through the CLI (`python -m ablate`, as the console script) and checks what the user sees.

Item 1: `ablate status` and `ablate ls` agree on a job killed with -9 (the lock says who is alive).
Item 2: every printing command survives a closed pipe. Item 3: one local-file data option reads
JSONL, JSON, CSV, parquet and save_to_disk dirs. Item 5: a data mistake is refused before the model
loads. Item 6: one progress bar, text on lines of its own, no library noise. Item 7: DPO scores only
the rows the run draws, with a progress bar. Item 8: `ablate generate --before`. Item 9: a pretrained
model's lr. Item 10: `ablate compare` on a sweep's folder takes its newest launch. Item 11: an
implausible cached peak is measured again. (Item 13 is the README test's `test_docs_state_no_test_counts...`.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import TESTS, ablate, summary
from integration.test_compare import write_run

FAST = ["method.args.save_strategy=no", "threads=1"]


def _env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "WANDB_MODE": "offline",
        **extra,
    }


def _terminal_lines(text: str) -> list[str]:
    """What a terminal shows of stdout and stderr written to it together: a `\\r` returns to the line's
    start, so each piece between `\\r`/`\\n` begins where the cursor was put."""
    return [piece for piece in re.split(r"[\r\n]", text) if piece.strip()]


def _run_dir(stdout: str) -> Path:
    return Path(re.findall(r"^run dir: (.+)$", stdout, flags=re.M)[-1].strip())


# ---- 1. one source of truth for a run's state -------------------------------------------------------


def test_status_and_ls_agree_on_a_job_killed_with_sigkill(tmp_path: Path) -> None:
    # far more steps than the test lives (it kills the job): `ablate status` below may first start the
    # tests' fork server (~15 s on a loaded machine), and a 400-step job had finished by then (once)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ablate",
            "train",
            "-m",
            "seed=1",
            "method.args.max_steps=100000",
            "method.args.logging_steps=1",
            *FAST,
        ],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 600
        metrics = None
        while time.time() < deadline and proc.poll() is None:
            found = list((tmp_path / "outputs" / "sweeps").glob("*/*/*/metrics.jsonl"))
            if found and len(found[0].read_text().splitlines()) >= 3:
                metrics = found[0]
                break
            time.sleep(0.2)
        assert metrics is not None, "the job never logged 3 steps"
        sweep_dir = metrics.parent.parent
        live = ablate("status", str(sweep_dir), cwd=tmp_path)
        assert live.returncode == 0, live.stderr
        assert "running at step" in live.stdout and "of 100000" in live.stdout, live.stdout
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert (
        json.loads((metrics.parent / "summary.json").read_text())["status"] == "running"
    )  # as kill -9 leaves it
    status = ablate("status", str(sweep_dir), cwd=tmp_path)
    listed = ablate("ls", "--json", cwd=tmp_path)
    assert status.returncode == 0 and listed.returncode == 0, status.stderr + listed.stderr
    assert "interrupted at step" in status.stdout and "running" not in status.stdout, status.stdout
    assert [row["status"] for row in json.loads(listed.stdout)] == ["interrupted"]


def test_status_without_a_dir_shows_the_newest_sweep_in_one_table(tmp_path: Path) -> None:
    """`ablate status` alone: the newest launch under outputs/sweeps, said as such; a sweep's folder:
    its newest launch; one table (state and key metric), no SLURM columns for a local sweep (issue 37:
    a usage line, and two tables for a finished sweep)."""
    old, new = (
        tmp_path / "outputs" / "sweeps" / name / launch
        for name, launch in (("dpo_loss", "2026-01-01_00-00-00"), ("grpo_spg", "2026-01-02_00-00-00"))
    )
    for sweep_dir, mtime in ((old, 1_000_000), (new, 2_000_000)):
        for seed in (1, 2):
            write_run(sweep_dir, seed - 1, [f"seed={seed}"], {"rewards/accuracies": 0.25 * seed, "loss": 1.0})
        (sweep_dir / "multirun.yaml").write_text("{}\n")
        os.utime(sweep_dir / "multirun.yaml", (mtime, mtime))
    r = ablate("status", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(
        f"sweep {new} (the newest sweep under outputs/sweeps; ablate status SWEEP_DIR "
        "for another): 2/2 jobs completed\n"
    ), r.stdout
    assert r.stdout.count("┏") == 1 and "rewards/accuracies=0.5" in r.stdout and "SLURM" not in r.stdout, (
        r.stdout
    )
    assert r.stdout.rstrip().endswith(f"compare: ablate compare {new}")
    r = ablate("status", "outputs/sweeps/dpo_loss", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith(
        f"sweep {old} (the newest sweep under outputs/sweeps/dpo_loss"
    ), r.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    r = ablate("status", cwd=empty)
    assert (
        r.returncode == 2 and "outputs/sweeps does not exist" in r.stderr and "ablate sweep NAME" in r.stderr
    )


def test_a_free_lock_on_another_host_proves_nothing(tmp_path: Path) -> None:
    """A run dir whose run.json names another host and whose lock nobody holds here: still `running`
    (flock on some network filesystems is local to a node); on this host it is `interrupted`."""
    from ablate.record import rundir

    for host, expected in (("elsewhere", "running"), (socket.gethostname(), "interrupted")):
        run = tmp_path / host
        run.mkdir()
        (run / "run.json").write_text(json.dumps({"overrides": [], "host": host, "pid": 1}))
        (run / "summary.json").write_text(json.dumps({"status": "running"}))
        (run / ".lock").write_text("PID 1 on host x\n")
        assert rundir.state(run) == expected


# ---- 2. a closed pipe --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["ls", "--json"],
        ["ls"],
        ["compare", "outputs"],
        ["--help"],
        ["train", "--cfg", "job"],
        ["status", "outputs/sweeps/s/2026-01-01_00-00-00"],
    ],
)
def test_printing_commands_survive_a_closed_pipe(tmp_path: Path, args: list[str]) -> None:
    """`ablate ls --json | head -3`: the reader has gone before ablate writes; no traceback, exit 0."""
    sweep = tmp_path / "outputs" / "sweeps" / "s" / "2026-01-01_00-00-00"
    for seed in range(30):  # more output than a pipe buffers
        write_run(sweep, seed, [f"seed={seed}"], {"rewards/margins": 0.1 * seed, "loss": 1.0})
    (sweep / "multirun.yaml").write_text("{}\n")
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "ablate", *args],
            cwd=tmp_path,
            env=_env(),
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    finally:
        os.close(write)
    assert r.returncode == 0 and "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr[
        -2000:
    ]


# ---- 3. local files of every kind --------------------------------------------------------------------

ROWS = [
    {"question": f"sort: {w} =", "good": " " + "".join(sorted(w)), "bad": " " + w}
    for w in ("dcba", "cab", "hgfe", "bca", "fed", "gfe", "ecd", "hba")
]
COLUMNS = ["data.columns.prompt=question", "data.columns.chosen=good", "data.columns.rejected=bad"]


def _write_kinds(d: Path) -> dict[str, Path]:
    from datasets import Dataset, DatasetDict

    ds = Dataset.from_list(ROWS)
    kinds = {
        "parquet": d / "pairs.parquet",
        "csv": d / "pairs.csv",
        "json": d / "pairs.json",
        "jsonl": d / "pairs.jsonl",
        "saved": d / "saved",
    }
    ds.to_parquet(kinds["parquet"])
    ds.to_csv(kinds["csv"], index=False)
    kinds["json"].write_text(json.dumps(ROWS))
    kinds["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    DatasetDict(train=ds, test=ds.select(range(2))).save_to_disk(str(kinds["saved"]))
    return kinds


def test_local_data_reads_every_kind_with_its_columns(tmp_path: Path) -> None:
    from ablate.data import KINDS, local
    from ablate.errors import DataError

    for kind, path in _write_kinds(tmp_path).items():
        data = local(str(path), columns={"prompt": "question", "chosen": "good", "rejected": "bad"})
        assert data.train.column_names == ["prompt", "chosen", "rejected"], kind
        assert data.train[0] == {"prompt": "sort: dcba =", "chosen": " abcd", "rejected": " dcba"}, kind
        assert (data.eval is not None) == (kind == "saved")  # a saved DatasetDict brings its test split
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(DataError) as e:
        local(str(tmp_path / "notes.txt"))
    assert KINDS in str(e.value) and "\n" not in str(e.value)


def test_parquet_given_as_data_jsonl_trains_and_csv_as_data_local_previews(tmp_path: Path) -> None:
    """The issue's path (`data=jsonl data.train_path=x.parquet`) and the new option's name, through the CLI."""
    kinds = _write_kinds(tmp_path)
    r = ablate(
        "train",
        "data=jsonl",
        f"data.train_path={kinds['parquet']}",
        *COLUMNS,
        "method.args.max_steps=1",
        "method.args.per_device_train_batch_size=4",
        *FAST,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert summary(_run_dir(r.stdout))["status"] == "completed"
    r = ablate(
        "data", "preview", "data=local", f"data.train_path={kinds['csv']}", *COLUMNS, "-n", "1", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "on 8 train rows, format: preference" in r.stdout and "sort: dcba =" in r.stdout


# ---- 5. the data's shape before the model ------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["jsonl", "csv", "parquet", "json"])
def test_rows_matching_no_format_are_refused_before_the_model_loads(tmp_path: Path, suffix: str) -> None:
    """Before the run dir exists, and before torch loads (issue 37: a CSV or parquet of the wrong
    columns took 7-20 s and left a failed run dir before its one line)."""
    import pandas as pd

    frame, path = pd.DataFrame(ROWS), tmp_path / f"renamed.{suffix}"
    {
        "jsonl": lambda: frame.to_json(path, orient="records", lines=True),
        "csv": lambda: frame.to_csv(path, index=False),
        "parquet": lambda: frame.to_parquet(path),
        "json": lambda: frame.to_json(path, orient="records"),
    }[suffix]()
    r = ablate("train", "data=local", f"data.train_path={path.name}", *FAST, cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-3000:]
    assert f"data.train_path={path.name}: DPO found columns ['bad', 'good', 'question']" in r.stderr, r.stderr
    assert (
        "data.columns" in r.stderr and "lean layers" not in r.stdout + r.stderr
    )  # the model was never built
    assert not (tmp_path / "outputs").exists()  # refused before the run dir


def test_the_header_check_reads_each_kind_as_the_loader_does(tmp_path: Path) -> None:
    """peek.columns = the loader's columns for every file kind (a saved dir: not peeked, the loader checks
    it); with data.columns the same files pass the check (test_parquet_given_as_data_jsonl_trains... trains one)."""
    from ablate.data import local, peek
    from ablate.data.formats import detect_columns, mapped_columns

    mapping = {"prompt": "question", "chosen": "good", "rejected": "bad", "text": None}
    for kind, path in _write_kinds(tmp_path).items():
        found = peek.columns(path)
        assert found == (None if kind == "saved" else local(str(path)).train.column_names), kind
        if found is not None:
            assert mapped_columns(found, mapping) == local(str(path), columns=mapping).train.column_names
            assert detect_columns(mapped_columns(found, mapping), "preference") == "preference"


def test_a_columns_mapping_to_a_missing_column_is_refused_before_the_run(tmp_path: Path) -> None:
    (tmp_path / "rows.csv").write_text("question,good,bad\nsort: ba =, ab, ba\n")
    r = ablate("train", "data=local", "data.train_path=rows.csv", "data.columns.prompt=query", cwd=tmp_path)
    assert r.returncode == 2 and "data.columns: no column ['query'] in the data" in r.stderr, r.stderr
    assert not (tmp_path / "outputs").exists()


# ---- 6 and 7. one clean bar; DPO scores only what it draws ------------------------------------------


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    cwd = tmp_path_factory.mktemp("scratch")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ablate",
            "train",
            "method=grpo",
            "method.args.max_steps=2",
            "method.args.logging_steps=1",
            *FAST,
        ],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )  # one stream, as a terminal shows both
    assert r.returncode == 0, r.stdout[-3000:]
    return cwd, r.stdout


def test_text_is_never_glued_to_the_bar_and_log_dicts_go_to_the_log_file(grpo_run: tuple[Path, str]) -> None:
    cwd, out = grpo_run
    lines = _terminal_lines(out)
    assert any(line.startswith("GRPO batch geometry") for line in lines), out[-3000:]
    assert not any("it/s]GRPO" in line or "?it/s]GRPO" in line for line in lines)
    assert "{'loss'" not in out and "'grad_norm'" not in out  # HF's 20-key dicts: not on the console
    assert "Generating train split" not in out and "Tokenizing" not in out  # no dataset bars
    assert (
        "kernels-community" not in out
    )  # bitsandbytes' import-time notice (CPUs with AVX512-BF16): not the user's
    # tqdm's rate reads it/s, or s/it when a step takes over a second (a busy machine)
    assert re.search(r"(it/s|s/it), loss \S+, reward \S+.*tok/s, MFU [\d.]+% of [\d.]+ [GTM]FLOP/s", out), (
        out[-2000:]
    )
    log = (_run_dir(out) / "ablate.log").read_text()
    assert "{'loss'" in log and "'grad_norm'" in log  # ... but in ablate.log, every one of them


def test_ctrl_c_says_where_it_stopped_and_a_rerun_names_the_run_to_resume(tmp_path: Path) -> None:
    """Ctrl-C: one line of its own below the bar (the step, `ablate resume DIR`, the checkpoint it
    continues from); the same command again starts a new run in a new default dir, and says which run
    it could have continued, and how (issue 37: the hint was glued to the bar; the rerun was silent)."""
    args = [
        sys.executable,
        "-m",
        "ablate",
        "train",
        "method.args.max_steps=6",
        "method.args.save_steps=2",
        "method.args.logging_steps=1",
        "+callbacks.stop._target_=crashing.InterruptAt",
        "threads=1",
    ]
    r = subprocess.run(
        args,
        cwd=tmp_path,
        env=_env(ABLATE_TEST_INTERRUPT_AT="4"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    assert r.returncode == 130, r.stdout[-3000:]
    (first,) = (tmp_path / "outputs" / "runs").glob("*/*")
    said = f"ablate: interrupted (SIGINT (Ctrl-C)) at step 3; `ablate resume {first}` continues it from checkpoint-2"
    assert said in _terminal_lines(r.stdout), r.stdout[-3000:]  # a line of its own, not glued to the bar
    again = subprocess.run(
        args,
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    assert again.returncode == 0, again.stdout[-3000:]
    assert (
        f"the same command's run in {first} is interrupted with a checkpoint; this is a new run from step 0 "
        f"(to continue that one instead: ablate resume {first})"
    ) in again.stdout, again.stdout[-3000:]
    assert summary(first)["status"] == "interrupted"  # untouched: the rerun has a dir of its own


def test_overfit_verdict_on_a_line_of_its_own(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ablate", "train", "debug=overfit", "threads=1"],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    assert any(
        re.match(
            r"debug=overfit: watched loss \(method.progress; must fall\) \S+ -> \S+ in 30 steps.*: OK$", line
        )
        for line in _terminal_lines(r.stdout)
    ), r.stdout[-3000:]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A DPO run of 4 steps (3 of 512 pairs' batches drawn) crashed at step 3 and resumed, with a
    cached peak no CPU has (0.00033 TFLOP/s, a probe taken on a busy machine)."""
    cwd = tmp_path_factory.mktemp("scratch")
    cache = cwd / "cache"
    cache.mkdir()
    bogus = {
        f"{socket.gethostname()}|cpu|float32|torch {torch.__version__}|threads {n}": 0.00033e12
        for n in range(1, 65)
    }
    (cache / "peak_flops.json").write_text(json.dumps(bogus))
    env = {"ABLATE_CACHE": str(cache)}
    # cache=off: each launch scores its reference log-probs itself (with the cache the resumed launch loads the
    # crashed one's: tests/integration/test_cache_losses.py)
    args = [
        "method.args.max_steps=4",
        "method.args.save_steps=2",
        "method.args.logging_steps=1",
        "threads=1",
        "+callbacks.crash._target_=crashing.CrashAt",
        "cache=off",
    ]
    crashed = ablate("train", *args, cwd=cwd, env={**env, "ABLATE_TEST_CRASH_AT": "3"})
    assert crashed.returncode != 0
    (run_dir,) = (cwd / "outputs" / "runs").glob("*/*")
    r = ablate("resume", str(run_dir), cwd=cwd, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return {"cwd": cwd, "run": run_dir, "crashed": crashed, "resumed": r, "cache": cache, "bogus": bogus}


def test_dpo_scores_only_the_pairs_the_run_draws_with_a_bar(resumed: dict) -> None:
    for r in (
        resumed["crashed"],
        resumed["resumed"],
    ):  # each launch scores the whole run's rows, the same ones
        assert "reference log-probs (the initial policy): scoring 40 of 512 train pairs" in r.stdout, r.stdout
        assert "Reference log-probs (train pairs)" in r.stderr  # its progress bar
    assert summary(resumed["run"])["status"] == "completed"


def test_resume_of_a_tied_head_is_quiet(resumed: dict) -> None:
    r = resumed["resumed"]
    assert "resuming from" in r.stdout
    assert "missing keys" not in r.stdout + r.stderr, r.stderr[-2000:]


def test_an_implausible_cached_peak_is_measured_again(resumed: dict) -> None:
    s = summary(resumed["run"])
    assert s["peak_tflops"] >= 1e-3 and 0 < s["mfu"] < 1  # at least a GFLOP/s: any CPU core
    cached = json.loads((resumed["cache"] / "peak_flops.json").read_text())
    fixed = [v["flops"] for k, v in cached.items() if cached[k] != resumed["bogus"].get(k)]
    assert fixed and all(v >= 1e9 for v in fixed)  # the contradicted entry was replaced
    assert re.search(r"MFU [\d.]+% of [\d.]+ [GT]FLOP/s", resumed["resumed"].stderr)  # the peak next to MFU


def test_eval_names_its_split_and_is_quiet(resumed: dict) -> None:
    r = ablate("eval", str(resumed["run"]), cwd=resumed["cwd"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Tokenizing train" not in r.stderr and "pin_memory" not in r.stderr, r.stderr[-2000:]
    assert "dpo eval on the eval split (64 examples)" in r.stdout


def test_qlora_run_has_no_peft_temp_path_warning(tmp_path: Path) -> None:
    pytest.importorskip("bitsandbytes")
    r = ablate("train", "+peft=qlora", "method.args.max_steps=1", *FAST, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Could not find a config file" not in r.stderr and "/tmp/ablate-tiny-" not in r.stderr


# ---- 8. what training changed --------------------------------------------------------------------------


def test_generate_before_shows_the_starting_model_beside_the_trained_one(resumed: dict) -> None:
    r = ablate(
        "generate",
        str(resumed["run"]),
        "--prompt",
        "sort: dcba =",
        "--before",
        "--max-new-tokens",
        "6",
        cwd=resumed["cwd"],
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert (
        lines[0].startswith("prompts: plain text") and lines[1] == ""
    )  # how the prompt was formatted, first
    assert lines[2] == ">>> sort: dcba =" and lines[3].startswith("before training: ")
    assert lines[4].startswith("after training:  ")


# ---- 9. a pretrained model's lr ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model,lr", [("smollm2_135m", "2.0e-05"), ("qwen2_5_0_5b", "2.0e-05"), ("tiny", "0.003")]
)
def test_a_model_option_carries_its_lr(tmp_path: Path, model: str, lr: str) -> None:
    r = ablate("train", f"model={model}", "--cfg", "job", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert re.search(rf"^  optimizer:\n(    .*\n)*?    lr: {re.escape(lr)}$", r.stdout, flags=re.M), r.stdout
    r = ablate("train", f"model={model}", "optimizer.optimizer.lr=1e-4", "--cfg", "job", cwd=tmp_path)
    assert re.search(r"^    lr: 0\.0001$", r.stdout, flags=re.M)  # the command line still wins


def test_a_large_model_at_the_toy_lr_warns(caplog: pytest.LogCaptureFixture) -> None:
    from ablate.methods.optim import warn_if_toy_lr

    big = torch.nn.Linear(4000, 3000)  # 12M parameters
    warn_if_toy_lr(big, torch.optim.AdamW(big.parameters(), lr=3e-3))
    assert "the tiny model's from-scratch lr" in caplog.text
    caplog.clear()
    warn_if_toy_lr(big, torch.optim.AdamW(big.parameters(), lr=2e-5))
    big.bias.requires_grad_(False)  # adapters train a part at high rates on purpose
    warn_if_toy_lr(big, torch.optim.AdamW([big.weight], lr=3e-3))
    assert caplog.text == ""


# ---- 10. compare a sweep's folder -------------------------------------------------------------------------


def test_compare_on_a_sweeps_folder_takes_its_newest_launch(tmp_path: Path) -> None:
    folder = tmp_path / "outputs" / "sweeps" / "dpo_loss"
    old = folder / "2026-01-01_10-00-00"
    for seed in (1, 2):  # a stale launch with other overrides
        write_run(
            old, seed, ["method.args.max_steps=5", f"seed={seed}"], {"rewards/margins": 9.0, "loss": 1.0}
        )
    new = folder / "2026-01-02_10-00-00"
    for num, (loss, seed) in enumerate([("sigmoid", 1), ("hinge", 1)]):
        write_run(
            new, num, [f"method/dpo_loss={loss}", f"seed={seed}"], {"rewards/margins": 0.5, "loss": 1.0}
        )
    for launch, started in ((old, "2026-01-01T10:00:00"), (new, "2026-01-02T10:00:00")):
        (launch / "multirun.yaml").write_text("{}\n")
        for run in launch.iterdir():
            if run.is_dir():
                (run / "run.json").write_text(json.dumps({"overrides": [], "started": started}))
    r = ablate("compare", "outputs/sweeps/dpo_loss", cwd=tmp_path, env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert "2 runs in 2 groups" in r.stdout and "max_steps" not in r.stdout.split("older")[0]
    assert "the newest launch only (2026-01-02_10-00-00)" in r.stdout and "--all-launches" in r.stdout
    r = ablate("compare", "outputs/sweeps/dpo_loss", "--all-launches", cwd=tmp_path, env={"COLUMNS": "200"})
    assert "4 runs in" in r.stdout and "2 launches kept apart" in r.stdout
    # a key one launch did not set has the config's value: only the arms that set it name it
    assert re.search(r"\] dpo_loss=sigmoid +│", r.stdout) and re.search(r"\] max_steps=5 +│", r.stdout), (
        r.stdout
    )


def test_compare_of_every_run_is_a_table_per_method_with_short_labels(tmp_path: Path) -> None:
    """`ablate compare outputs/runs` over DPO, SFT and GRPO runs: a table per method, each grouped by what
    varies inside it, labelled by the keys each run set and, for a run outside a sweep, its start time
    (issue 37: one 22-group table, every label listing every key, `key=default` and the whole dir name)."""
    day = tmp_path / "outputs" / "runs" / "2026-01-01"
    made = [
        ("dpo", ["method.args.beta=0.2"]),
        ("dpo", []),
        ("sft", ["method=sft", "method.args.max_steps=400"]),
        ("grpo", ["method=grpo"]),
        ("grpo", ["method=grpo", "method.args.num_generations=4"]),
    ]
    for num, (method, overrides) in enumerate(made):
        run = write_run(day, num, overrides, {"loss": 0.5, "reward": 0.25, "rewards/accuracies": 1.0})
        run = run.rename(day / f"10-00-0{num}-000000_{','.join(overrides)}")
        info = json.loads((run / "summary.json").read_text())
        info.update(
            method=method,
            compare_metrics={"dpo": ["rewards/accuracies", "loss"], "sft": ["loss"], "grpo": ["reward"]}[
                method
            ],
        )
        (run / "summary.json").write_text(json.dumps(info))
    r = ablate("compare", "outputs/runs", cwd=tmp_path, env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    titles = re.findall(r"^\s*(\w+): (\d) runs in (\d) groups", r.stdout, flags=re.M)
    assert titles == [("dpo", "2", "2"), ("sft", "1", "1"), ("grpo", "2", "2")], r.stdout
    assert (
        "[2026-01-01/10-00-00-000000] beta=0.2 " in r.stdout
        and "[2026-01-01/10-00-01-000000] defaults " in r.stdout
    )
    assert "[2026-01-01/10-00-04-000000] num_generations=4 " in r.stdout and "=default" not in r.stdout
    assert "method=" not in r.stdout.replace("--metric", "")  # the method is the table, not a label
    if importlib.util.find_spec("matplotlib"):  # a folder per method; the same --out again rewrites it
        for _ in range(2):
            r = ablate("compare", "outputs/runs", "--out", "rep", cwd=tmp_path)
            assert r.returncode == 0, r.stderr
        assert {p.name for p in (tmp_path / "rep").iterdir()} == {".ablate-report", "dpo", "sft", "grpo"}


def test_compare_out_alone_writes_in_the_sweep_or_under_outputs_reports(tmp_path: Path) -> None:
    """`--out` alone: a sweep launch's own report/ (no run dir written into), else outputs/reports/<time>/;
    said first (issue 37: the README's `--out report/` wrote into the repo root)."""
    pytest.importorskip("matplotlib")
    sweep = tmp_path / "outputs" / "sweeps" / "dpo_loss" / "2026-01-01_10-00-00"
    for seed in (1, 2):
        write_run(sweep, seed, [f"seed={seed}"], {"loss": 0.5})
    (sweep / "multirun.yaml").write_text("{}\n")
    before = {p: p.stat().st_mtime for p in sweep.rglob("*") if p.is_file()}
    r = ablate("compare", "outputs/sweeps/dpo_loss", "--out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"report dir: {sweep.resolve() / 'report'} (--out without a dir:"), r.stdout
    assert (sweep / "report" / "report.html").is_file()
    assert all(p.stat().st_mtime == t for p, t in before.items())  # the runs' own files untouched
    r = ablate("compare", str(sweep / "1_seed=1"), "--out", cwd=tmp_path)  # one run: not written into
    assert r.returncode == 0 and list((tmp_path / "outputs" / "reports").glob("*/report.html")), r.stdout
    assert not (sweep / "1_seed=1" / "report").exists()
