"""The docs test themselves: every command line in the ```bash blocks of README.md and of every docs/*.md page
runs, as written, from a scratch copy of the repo (a fresh clone, its path holding a space), with the
default run dirs, the default sweep dir and the default `outputs/`, in the order the doc gives them.

A new line in a doc is run by default. The only ways around that are the rules below, each with its
reason, shown by pytest as the skip reason (`pytest -rs`):

- SKIP: lines that cannot run on a CPU machine without network or root (SLURM, online W&B, the
  test suite itself). `&&`-chained set-up steps (venv, `pip install`) are left out: the test runs
  in the environment they installed.
- SLOW: lines that take minutes; they run in the `-m slow` suite, after the earlier slow lines of their
  doc (what a slow line reads, a sweep dir, the fetched model, is made by slow lines; the default lines
  before it, run by the default suite, are not run again).
- COVERED: lines that repeat a run a named test makes, and asserts more about (every DPO loss, every
  optimizer, LoRA, the debug presets...; the SmolLM2 experiments, by the slow suite): composed with
  `--cfg job` in the default suite (a key, group or option the docs name that no longer exists fails
  it) and not trained a second time.
- Step counts: `method.args.max_steps=2` is appended to an `ablate train|sweep` line that does not set
  it already (Quick start runs untouched: it is the README's promise, seconds; `debug=` presets keep their own).
- Placeholders: `outputs/runs/<date>/<time>_<overrides>` is filled with the real dir of an
  interrupted run (resuming a completed run does nothing); files the docs expect the user to have
  (`my_pairs.jsonl`) are written first, and so are the docs' own code blocks that start with
  `# <file name>` (`my_losses.py`).

`ablate` on the PATH is the ablate under test (a shim running `python -m ablate` with its `src/` last
on PYTHONPATH, so a line's own `PYTHONPATH=...` prefix still works); `python`, `torchrun`, `wandb`
are the test's environment's.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import ROOT, TESTS, summary

import ablate

DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
STEPS = "method.args.max_steps=2"

# GRPO with vLLM past one process (docs/distributed.md, the README's cheat-sheet): vLLM has a venv of its own, where
# tests/slow/test_vllm_distributed.py runs these layouts through the CLI (2 ranks, FSDP2, a server it starts, trains
# on, kills and restarts, async through both)
VLLM_TESTED = "needs vLLM (its own venv): tests/slow/test_vllm_distributed.py runs it through the CLI"
VLLM_LINES = {
    "torchrun --nproc_per_node=2 -m ablate train +experiment=smollm2_grpo method/rollouts=vllm method.args.use_cpu=true": VLLM_TESTED,
    "ablate serve-rollouts +experiment=smollm2_grpo --port 8000": "starts a vLLM server that runs until stopped: "
    + VLLM_TESTED,
    "ablate train +experiment=smollm2_grpo method/rollouts=vllm_server method.rollouts.url=http://127.0.0.1:8000": "needs a running server: "
    + VLLM_TESTED,
    "torchrun --nproc_per_node=2 -m ablate train +experiment=smollm2_grpo method/rollouts=vllm_server method.rollouts.url=http://127.0.0.1:8000 method.args.use_cpu=true": "needs a running server: "
    + VLLM_TESTED,
    "ablate train +experiment=smollm2_grpo method/rollouts=vllm_server method.rollouts.start=true": VLLM_TESTED,
    "ablate train +experiment=smollm2_grpo method/rollouts=vllm method.args.max_staleness=1": VLLM_TESTED,
}
SKIP = {
    "python -m pytest": "the test suite itself (it runs this test)",
    "python -m pytest -m slow": "the slow test suite itself",
    "python -m pytest -m slow tests/slow/test_vllm.py tests/slow/test_vllm_distributed.py -n 0": "the vLLM engine's slow tests themselves (their own venv)",
    "ablate train +experiment=smollm2_grpo method/rollouts=vllm": "needs vLLM, which has a venv of its own (tests/slow/test_vllm.py runs GRPO with it through the CLI)",
    **VLLM_LINES,
    "ablate sweep dpo_loss hydra/launcher=slurm": "needs a SLURM cluster (tests/slow/test_slurm.py)",
    "ablate sweep dpo_loss hydra/launcher=slurm --detach": "needs a SLURM cluster (tests/slow/test_slurm.py)",
    "ablate train -m seed=1 hydra/launcher=slurm hydra.launcher.tasks_per_node=2 method.args.use_cpu=true": "needs a SLURM cluster (tests/slow/test_slurm.py)",
    "ablate train -m seed=1 hydra/launcher=slurm hydra.launcher.nodes=2 hydra.launcher.tasks_per_node=1 "
    "method.args.use_cpu=true": "needs a SLURM cluster of two nodes (tests/slow/test_slurm_multinode.py)",
    "bash scripts/slurm/start.sh": "installs and starts SLURM as root with apt (tests/slow/test_slurm.py)",
    "torchrun --nproc_per_node=8 -m ablate train distributed=fsdp model=...": "needs 8 CUDA GPUs",
    "torchrun --nnodes=2 --nproc_per_node=1 --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29400 --rdzv_id=myrun "
    "-m ablate train distributed=fsdp hydra.run.dir=/shared/runs/myrun": "one of two nodes (another machine at 10.0.0.1); tests/slow/test_fsdp.py runs two nodes on loopback",
    "ablate train logger=wandb logger.mode=online logger.project=myproj": "needs network and a W&B account",
    "ablate eval outputs/dpo eval=lm_eval 'eval.lm_eval.tasks=[gsm8k,ifeval]'": "lm-eval's own tasks read the Hugging "
    "Face hub (no network here but the package index); tests/unit/test_eval_backends.py and "
    "tests/slow/test_eval_jobs.py check the one line it gives offline",
    "wandb sync outputs/runs/<date>/<time>_<overrides>/wandb/offline-run-*": "uploads to W&B (network)",
    "ablate sweep dpo_loss hydra/launcher=ray hydra.launcher.address=10.0.0.1:6379": "needs a Ray cluster of several machines (docs/distributed.md's one-machine cluster lines run; tests/slow/test_ray.py)",
    "ablate sweep dpo_loss hydra/launcher=ray hydra.launcher.address=10.0.0.1:6379 hydra.launcher.num_gpus=1": "needs a Ray cluster of GPU machines (docs/distributed.md's one-machine cluster lines run; tests/slow/test_ray.py)",
    "ray start --head --port=6379 --num-gpus=8": "starts a node of a real Ray cluster (8 GPUs, port 6379, all interfaces)",
    "ray start --address=10.0.0.1:6379 --num-gpus=8": "joins a Ray cluster on another machine",
    "bash scripts/gpu_wheels.sh": "downloads wheels for another machine (a GPU one without a package index)",
    "export PYTHONPATH=$PWD/src && cp src/ablate/speed/measured.json $OUT/ && python benchmarks/gpu.py --record "
    "$OUT/measured.json --out $OUT/gpu.json --smoke-dir $OUT/smoke 2>&1 | tee $OUT/gpu.txt": "needs a CUDA GPU (the H200 run); its CPU mode runs in tests/slow/test_gpu_bench_cpu.py",
    "python benchmarks/gpu.py --device cpu --tiny --smoke-dir outputs/gpu_smoke_cpu": "minutes of TRL and ablate processes (every section on CPU): tests/slow/test_gpu_bench_cpu.py runs it",
}
# sections whose lines need an optional package (skipped without it, with the reason) and take minutes (slow)
NEEDS = {
    "A Ray cluster on one machine": ("ray", "a 2-node Ray cluster on this machine, then a sweep on it"),
    "Running, resuming, reading a study": ("optuna", "a study: several trials of the tiny task"),
}
# the same for single lines of a section that needs nothing else (a line whose command starts with the key)
NEEDS_LINE = {"ablate sweep tune_dpo_beta_lr": ("optuna", "a study: several trials of the tiny task")}
# lines that start something outliving the line: what stops it when the doc's test ends, even after a failure
CLEANUP = {"python scripts/ray/local_cluster.py start": "python scripts/ray/local_cluster.py stop"}
SETUP = re.compile(
    r"^(python3? -m venv \S+|\. \S+/bin/activate|(python3? -m )?pip (un)?install .*)$"
)  # chained set-up steps
SLOW = {  # a line whose command starts with one of these runs only in the `-m slow` suite
    "ablate sweep ": "a sweep: 2 to 12 jobs",
    "ablate train -m ": "a multirun: 6 jobs",
    "ablate compare outputs/sweeps/": "reads the sweeps above",
    "torchrun ": "2 processes",
    "ablate fetch smollm2_135m": "downloads and converts a 135M model on first use",
    "ablate train model=smollm2_135m": "a 135M-parameter model",
    "ablate data preview +experiment=smollm2": "fetches and converts SmolLM2 on first use",
    "ablate train method.args.max_steps=200 ": "200 steps",
    # docs/eval.md: an SFT model, a reward model to judge, DPO on the SFT model, then its evaluations
    "ablate train method=sft method.args.max_steps=400 hydra.run.dir=": "400 SFT steps (the README's SFT line runs by default)",
    "ablate train hydra.run.dir=outputs/rm ": "the judge: a reward model of the tiny pairs",
    "ablate train model=local model.path=outputs/sft/model ": "DPO on the SFT model above",
    "ablate eval outputs/dpo": "evaluates the DPO run above (lm-eval's tasks, a judged win rate)",
    "ablate eval outputs/sweeps/": "evaluates the sweep above",
}
COVERED = {  # a line whose command starts with one of these is composed only: the named test trains it
    "ablate train 'eval=": "tests/integration/test_eval.py trains with eval=[heldout] and tests/slow/test_eval_jobs.py "
    "with lm-eval and the judge, at the end of each job",
    "ablate train logger=wandb": "tests/integration/test_wandb.py trains with W&B (offline) by default",
    "PYTHONPATH=examples/": "tests/integration/test_examples.py trains each example by default",
    # SmolLM2 (135M parameters): trained by the slow suite, each to a held-out target
    "ablate train +experiment=smollm2_calc_tools": "tests/slow/test_smollm2_tools.py trains SmolLM2's SFT warm start, "
    "then GRPO calling the calculator in the hermes format",
    "ablate train +experiment=qwen7b": "tests/integration/test_plan.py trains each 7B experiment scaled down (+shrink=tiny)",
    "ablate train +experiment=smollm2": "tests/slow/test_smollm2.py trains each SmolLM2 experiment to a held-out target",
    "ablate train model=smollm2_135m +peft=": "tests/slow/test_lora_smollm2.py trains LoRA on SmolLM2 through the CLI",
    # sweep files: each runs whole (every job, then compare) in the slow suite; `ablate sweep dpo_loss`
    # lines still run here (the README's compare lines read their default sweep dir)
    "ablate sweep grpo_": "tests/slow/test_sweeps.py runs every sweep file's jobs and compares them",
    "ablate sweep dpo_losses": "tests/slow/test_sweeps.py runs every sweep file's jobs and compares them",
    "ablate train debug=": "tests/integration/test_debug.py runs every debug preset by default",
    "ablate train +peft=": "tests/integration/test_peft.py runs LoRA and QLoRA by default",
    "ablate train method=grpo +peft=": "tests/integration/test_peft.py runs GRPO with LoRA by default",
    "ablate train 'tags=": "tests/integration/test_ls.py runs tags, notes and threads by default",
    "ablate train threads=": "tests/integration/test_ls.py runs tags, notes and threads by default",
    "ablate train peak_tflops=": "tests/integration/test_speed.py runs a user-set peak by default",
    "ablate train method=dpo_hinge ": "tests/parity/test_trl_dpo.py trains every DPO loss against TRL by default",
    "ablate train method/dpo_loss=": "tests/parity/test_trl_dpo.py trains every DPO loss against TRL by default",
    "ablate train method=grpo method/": "tests/parity/test_trl_grpo.py trains every GRPO loss and objective by default",
    "ablate train +experiment=calc_tools": "tests/slow/test_calc_tools.py trains the SFT warm start, then GRPO with the "
    "calculator (tool calls, reward rising) and with the OneCall environment",
    "ablate train method=grpo method.args.": "tests/parity/test_trl_grpo.py (GSPO, num_iterations) and "
    "tests/unit/test_grpo_async.py (max_staleness, generation_dtype) and "
    "tests/unit/test_async_cores.py (async_threads) train them by default",
    "ablate train optimizer=": "tests/unit/test_optimizer.py trains every optimizer option by default",
    # the methods beyond DPO/SFT/GRPO: trained to a target and evaluated by default, and against TRL per step
    "ablate train method=reward": "tests/integration/test_methods.py trains and evaluates method=reward by default",
    "ablate train method=grpo data=tiny_prefs '+data.reward_funcs.rm=": "tests/integration/test_reward_model.py trains a reward model, then GRPO against its run dir, by default",
    "ablate train method=kto": "tests/integration/test_methods.py trains method=kto and tests/parity/test_trl_kto.py "
    "each KTO loss type by default",
    "ablate train method=rloo": "tests/integration/test_methods.py trains method=rloo and tests/parity/test_trl_rloo.py "
    "its options (KL penalty, normalisation, clipping) by default",
    "ablate train speed=off": "tests/integration/test_speed_plan.py trains speed=off against the default by default",
    "ablate train speed.compile=": "tests/slow/test_compile_path.py trains speed.compile=true against the eager layers",
    "ablate train speed.": "tests/unit/test_dpo_speed_paths.py trains each DPO speed path off against on by default",
    "ablate train method=grpo speed.": "tests/unit/test_grpo_share_prompt.py trains GRPO's rows both ways by default",
}
UNTOUCHED_SECTIONS = {"Quick start"}  # run with their own step counts
USER_FILES = {
    "my_pairs.jsonl": ROOT / "src/ablate/data/tiny/sort_prefs_train.jsonl",  # "your own data"
    "my_prompts.jsonl": ROOT / "src/ablate/data/tiny/repeat_letter_train.jsonl",  # your own prompts (GRPO)
    "myrew.py": ROOT / "examples/grpo_own_code/myrew.py",
}  # your own reward function (docs/methods.md shows it)
RESUMABLE = "outputs/runs/<date>/<time>_<overrides>"
CLAIMS = {  # what the README says a line leads to, beyond "exit 0, every printed run dir completed"
    "ablate train": lambda s: s["metrics"]["rewards/accuracies"] == 1.0  # Quick start: "reaches 1.0"
}


def _eval_accuracy(out: str) -> float:
    """`ablate eval`'s eval.json (the path it prints last): held-out eval_rewards/accuracies."""
    import json

    wrote = re.findall(r"^wrote (.+eval\.json)$", out, flags=re.M)[-1]
    return json.loads(Path(wrote).read_text())["metrics"]["eval_rewards/accuracies"]


def _before_after(out: str) -> tuple[str, str]:
    before = re.search(r"^before training: (.*)$", out, flags=re.M).group(1).strip()
    after = re.search(r"^after training: (.*)$", out, flags=re.M).group(1).strip()
    return before, after


def _matches(out: str) -> tuple[int, int]:
    """`ablate generate --prompts FILE`'s last line: completions equal to the file's, of how many."""
    done, total = re.search(r"^(\d+)/(\d+) completions equal the file's", out, flags=re.M).groups()
    return int(done), int(total)


OUTPUT_CLAIMS = {  # what the Quick start says a look at the run shows (stdout of the line, as printed)
    "ablate eval last": lambda out: _eval_accuracy(out) == 1.0,
    'ablate generate last --prompt "sort: dcba =" --before': lambda out: (
        _before_after(out)[1] == "abcd" and _before_after(out)[0] != "abcd"
    ),
    # the 400-step SFT run sorts the held-out prompts (issue 37: 13/64 while prompts got the chat template)
    "ablate generate last --prompts src/ablate/data/tiny/sort_sft_eval.jsonl": lambda out: (
        _matches(out)[1] == 64 and _matches(out)[0] >= 58
    ),
}


@dataclass
class Line:
    doc: str
    lineno: int
    section: str
    text: str  # the line as written, comment included
    command: str = ""  # what runs: set-up segments and the comment removed
    skip: str | None = None
    slow: str | None = None
    covered: str | None = None  # the test that trains this line's run (COVERED): composed only here

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.lineno} {self.command or self.text}"[:100]


def _key(command: str) -> str:
    return " ".join(command.split())


def _strip_comment(text: str) -> str:
    return re.split(r"\s+#\s", " " + text, maxsplit=1)[0].strip()


def parse(doc: str) -> tuple[list[Line], dict[str, str]]:
    """The doc's bash command lines (in order) and its `# <file>`-headed code blocks (name -> text)."""
    lines: list[Line] = []
    files: dict[str, str] = {}
    section, block, lang, start = "", None, "", 0
    for n, raw in enumerate((ROOT / doc).read_text().splitlines(), 1):
        if block is None:
            if raw.startswith("## "):
                section = raw[3:].strip()
            elif raw.startswith("```"):
                block, lang, start = [], raw[3:].strip(), n
            continue
        if not raw.startswith("```"):
            block.append(raw)
            continue
        name = re.fullmatch(r"#\s*([\w./-]+\.\w+)\s*", block[0]) if block else None
        if name and lang not in ("bash", "sh", "shell"):
            files[name.group(1)] = "\n".join(block) + "\n"
        if lang in ("bash", "sh", "shell"):
            lines += [
                Line(doc, start + i + 1, section, t)
                for i, t in enumerate(block)
                if t.strip() and not t.lstrip().startswith("#")
            ]
        block = None
    for line in lines:
        parts = [p.strip() for p in _strip_comment(line.text).split("&&")]
        line.command = " && ".join(p for p in parts if not SETUP.match(p))
        key = _key(line.command)
        line.skip = SKIP.get(key) or (
            None if line.command else "set-up only (the test runs in the installed env)"
        )
        line.covered = next((why for k, why in COVERED.items() if (key + " ").startswith(k)), None)
        line.slow = (
            None
            if line.covered
            else next((why for k, why in SLOW.items() if (key + " ").startswith(k)), None)
        )
        needs = NEEDS.get(line.section) or next(
            (v for k, v in NEEDS_LINE.items() if (key + " ").startswith(k + " ")), None
        )
        if needs and not line.skip:
            module, why = needs
            line.slow = why
            if importlib.util.find_spec(module) is None:
                line.skip = f"needs the optional package {module}: pip install 'ablate[{module}]'"
    return lines, files


def _all_lines() -> list[Line]:
    """Every doc's lines; a command already given by an earlier line (of any doc) runs once, there."""
    out: list[Line] = []
    first: dict[str, Line] = {}
    for doc in DOCS:
        for line in parse(doc)[0]:
            key = _key(line.command)
            if not line.skip and key in first:
                line.skip = f"the same command as {first[key].doc}:{first[key].lineno}, run there"
            first.setdefault(key, line)
            out.append(line)
    return out


ALL = _all_lines()


def _param(line: Line):
    # the id starts with the doc: tests/conftest.py's `group` runs a doc's lines on one xdist worker
    return pytest.param(line, id=line.id, marks=[pytest.mark.slow] if line.slow and not line.skip else [])


@dataclass
class DocRun:
    """One doc's lines run in order in one scratch clone; results cached by line number."""

    doc: str
    cwd: Path
    env: dict[str, str]
    results: dict[int, subprocess.CompletedProcess] = field(default_factory=dict)
    cleanup: list[str] = field(default_factory=list)  # CLEANUP commands of lines that ran

    def run(self, target: Line) -> subprocess.CompletedProcess:
        # earlier lines first: later ones use their outputs (outputs/my_run, a sweep dir); a default
        # line after the default lines before it, a slow line after the slow lines before it
        for line in ALL:
            if line.doc != self.doc or line.lineno > target.lineno:
                continue
            if line.skip or line.lineno in self.results or bool(line.slow) != bool(target.slow):
                continue
            self.results[line.lineno] = self._exec(line)
        return self.results[target.lineno]

    def _exec(self, line: Line) -> subprocess.CompletedProcess:
        command = line.command
        if command in CLEANUP:
            self.cleanup.append(CLEANUP[command])
        if RESUMABLE in command:
            command = command.replace(RESUMABLE, self._interrupted_run())
        # debug presets set their own (small) step counts: overfit checks its 30 steps halve the loss
        if (
            line.section not in UNTOUCHED_SECTIONS
            and re.search(r"\bablate (train|sweep)\b", command)
            and "method.args.max_steps=" not in command
            and "debug=" not in command
        ):
            command = f"{command} {STEPS}"
        if line.covered:
            command = f"{command} --cfg job"  # composed, not trained: line.covered trains it
        return subprocess.run(
            ["bash", "-c", command], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=1800
        )

    def _interrupted_run(self) -> str:
        """A default-named run dir (relative to the cwd, as a user pastes it) of a run killed at step 3 of 4."""
        before = set((self.cwd / "outputs/runs").glob("*/*"))
        subprocess.run(
            [
                "ablate",
                "train",
                "method.args.max_steps=4",
                "method.args.save_steps=2",
                "+callbacks.crash._target_=crashing.CrashAt",
            ],
            cwd=self.cwd,
            env={**self.env, "ABLATE_TEST_CRASH_AT": "3"},
            capture_output=True,
            timeout=900,
        )
        [run_dir] = set((self.cwd / "outputs/runs").glob("*/*")) - before
        assert summary(run_dir)["status"] == "failed"
        return str(run_dir.relative_to(self.cwd))


def _scratch_clone(root: Path) -> Path:
    """What `git clone` of this checkout would hold: its files that git does not ignore (never the
    user's venvs, `.venv-vllm` alone is GBs, nor outputs or wheels); without git, the same by name."""
    clone = root / "my clone"
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
    )
    if listed.returncode != 0:
        shutil.copytree(
            ROOT,
            clone,
            ignore=shutil.ignore_patterns(
                ".git",
                ".venv*",
                ".gpu_wheels",
                "outputs",
                "multirun",
                "report",
                "wandb",
                "__pycache__",
                "*.egg-info",
                ".pytest_cache",
            ),
        )
        return clone
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():  # a tracked file deleted in the working tree is not in the clone
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    return clone


def _env(bin_dir: Path) -> dict[str, str]:
    src = Path(ablate.__file__).resolve().parents[1]
    shim = bin_dir / "ablate"
    shim.write_text(
        f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{src}" exec "{sys.executable}" -m ablate "$@"\n'
    )
    shim.chmod(0o755)
    return {
        **os.environ,
        "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]),
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "WANDB_MODE": os.environ.get("WANDB_MODE", "offline"),
    }  # never upload from a test


@pytest.fixture(scope="module")
def doc_runs(tmp_path_factory) -> Iterator[dict[str, DocRun]]:
    runs = {}
    for doc in sorted(
        {line.doc for line in ALL if not line.skip}
    ):  # a scratch clone per doc with lines to run
        root = tmp_path_factory.mktemp("doc")
        (root / "bin").mkdir()
        cwd = _scratch_clone(root)
        for name, src in USER_FILES.items():
            shutil.copy(src, cwd / name)
        for name, text in parse(doc)[1].items():
            (cwd / name).parent.mkdir(parents=True, exist_ok=True)
            (cwd / name).write_text(text)
        runs[doc] = DocRun(doc, cwd, _env(root / "bin"))
    yield runs
    for run in runs.values():  # a Ray cluster a doc started must not outlive its test, failed or not
        for command in run.cleanup:
            subprocess.run(
                ["bash", "-c", command], cwd=run.cwd, env=run.env, capture_output=True, timeout=300
            )


@pytest.mark.parametrize("line", [_param(line) for line in ALL])
def test_doc_line_runs(line: Line, doc_runs):
    if line.skip:
        pytest.skip(f"{(line.command or line.text)[:60]}: {line.skip}")
    r = doc_runs[line.doc].run(line)
    assert r.returncode == 0, f"{line.id}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    if line.covered:  # the job's config, composed (Hydra printed it: the method's trainer and its args)
        assert "_target_: ablate.methods." in r.stdout and "max_steps:" in r.stdout, (
            f"{line.id}\n{r.stdout[-3000:]}"
        )
    for printed in re.findall(r"^run dir: (.+)$", r.stdout, flags=re.M):
        s = summary(Path(printed))
        assert s["status"] in ("completed", "pruned"), (
            printed
        )  # a study's trial may be pruned (as it should be)
        claim = CLAIMS.get(_key(line.command)) if line.section in UNTOUCHED_SECTIONS else None
        assert claim is None or claim(s), f"{line.id}: {s['metrics']}"
    said = OUTPUT_CLAIMS.get(_key(line.command)) if line.section in UNTOUCHED_SECTIONS else None
    assert said is None or said(r.stdout), f"{line.id}: the README's claim does not hold:\n{r.stdout[-3000:]}"
    for done, total in re.findall(r"(\d+)/(\d+) jobs completed", r.stdout):
        assert done == total != "0", r.stdout[-3000:]


def test_docs_have_their_sections_and_the_rules_match_lines():
    """The parser finds what the README promises, and no rule names a line that no longer exists."""
    readme = [line for line in ALL if line.doc == "README.md"]
    # the two commands (the vLLM venv's install line, also in the Quick start, is a CI step, not one of them)
    quick = [
        line
        for line in readme
        if line.section == "Quick start" and line.text.startswith("python3 -m venv .venv ")
    ]
    assert [line.command for line in quick] == ["ablate train", "python -m pytest"]  # the two commands
    assert len([line for line in readme if line.section == "Cheat-sheet"]) >= 20
    assert len([line for line in ALL if line.doc == "docs/extending.md"]) >= 4
    keys = {_key(line.command) for line in ALL}
    assert set(SKIP) <= keys, set(SKIP) - keys
    for rule in [*SLOW, *COVERED]:
        assert any((k + " ").startswith(rule) for k in keys), rule
    for rule, why in COVERED.items():  # the test named trains it, and the line is one `ablate train|sweep`
        assert all((ROOT / t).is_file() for t in re.findall(r"tests/\S+\.py", why)) and "tests/" in why, why
        for line in ALL:
            if line.covered == why and not line.skip:
                assert re.fullmatch(r"(PYTHONPATH=\S+\s+)?ablate (train|sweep) [^&|;]*", line.command), (
                    line.command
                )
    runnable = [line for line in ALL if not line.skip]
    assert len([line for line in runnable if not line.slow]) >= 12  # most single runs: the default suite


def test_docs_state_no_test_counts_or_suite_times():
    """Numbers in the docs come from a command anyone can rerun, or go: a count of tests or a time for
    the suite goes stale with every test added (`pytest --collect-only -q` counts them)."""
    stale = re.compile(r"\b\d+ tests\b|\btests in ~?\d|\(\d+ tests, ")
    statistical = re.compile(r"adjusted for \d+ tests")  # ablate compare's own output: its statistical tests
    for doc in DOCS:
        for n, text in enumerate((ROOT / doc).read_text().splitlines(), 1):
            assert not stale.search(statistical.sub("", text)), f"{doc}:{n}: {text.strip()}"


def test_quick_start_claims_name_real_lines():
    """Every claim the README test checks belongs to a line of the Quick start as written."""
    quick = {
        _key(line.command) for line in ALL if line.doc == "README.md" and line.section in UNTOUCHED_SECTIONS
    }
    assert set(OUTPUT_CLAIMS) <= quick, set(OUTPUT_CLAIMS) - quick


def test_ci_runs_the_readme_commands():
    """.ci/run installs as the Quick start's test command does and runs the README's test commands."""
    ci = (ROOT / ".ci/run").read_text().splitlines()
    quick = [line for line in ALL if line.doc == "README.md" and line.section == "Quick start"]
    tests_line = next(line for line in quick if "pytest" in line.text)
    setup = _strip_comment(tests_line.text).rsplit("&&", 1)[0].strip()
    assert setup in [c.strip() for c in ci]
    for line in ALL:
        if line.doc == "README.md" and "pytest" in line.command and line.section != "Quick start":
            assert line.command in [c.strip() for c in ci], line.command
