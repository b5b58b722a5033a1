"""A user's bad day, as a table: every bad input gets exit status 2 and ONE line on stderr naming
what to fix (no traceback), no model is built when the mistake is visible in the config (no run
dir is even created), and an existing run dir is never touched.

Each case runs the real CLI in a subprocess from its own scratch cwd (default run dirs), which holds
an older run dir that must come out byte- and mtime-identical. The cases run concurrently (a
module fixture hands them all to tests/fork_runner.py, which imports the CLI once and forks a
child per case), so the table costs a fraction of a second per case; the tests only read results.

Phases: `config` cases are refused before anything exists (the whole scratch cwd is unchanged), and,
unless marked `torch`, before torch is even imported (~1 s each); `torch` cases need the method's
code to judge (a loss against its method, precision against the machine: still before the run dir);
`run` cases are data or model problems seen only once the file or model is read: the run dir exists,
its summary.json says `failed` with that same one line, and the line is the last thing on stderr.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import TESTS, ablate, hiding

OLD = "outputs/runs/2026-01-01/00-00-00"  # an earlier run in every scratch cwd: must stay untouched
ROWS = [{"prompt": f"sort {i}", "chosen": "abc", "rejected": "cba"} for i in range(8)]
SHORT_REWARD = "def short(completions, **kwargs):\n    return [-float(len(c)) for c in completions]\n"


def _study_db() -> bytes:
    """An SQLite database with Optuna's `studies` table, several pages long (half of it: a truncated copy)."""
    import sqlite3

    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE studies (study_id INTEGER PRIMARY KEY, study_name TEXT)")
    db.executemany("INSERT INTO studies (study_name) VALUES (?)", [(f"s{i}" * 50,) for i in range(400)])
    db.commit()
    return db.serialize()


STUDY = "hydra:\n  overrides:\n    task: [+sweep=tune_dpo_beta_lr, hydra.sweeper.n_trials=1]\n    hydra: []\n"
STUDY_FILES = (("sw/multirun.yaml", STUDY), ("sw/study.db", _study_db()))
STUDY_TRUNCATED = (("sw/multirun.yaml", STUDY), ("sw/study.db", _study_db()[:45056]))
SWEEP_FILES = (
    ("sw/multirun.yaml", "hydra: {}\n"),
    ("sw/.lock", "PID 1 on host h\n"),
    ("sw/0_seed=1/run.json", '{"overrides": ["seed=1"]}\n'),
)  # an earlier launch's
REWARD = "train method=grpo +data.reward_funcs.mine._partial_=true +data.reward_funcs.mine._target_"  # tests/bad_rewards.py
GRPO1 = "method.args.max_steps=1"
SQUARED = (
    "def squared(logp_c, logp_r, ref_c, ref_r, n_c, n_r, beta):\n    return (logp_c - logp_r) ** 2, {}\n"
)


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]  # after `ablate`; {F} = the fixtures dir
    says: str  # the error line must contain this (what to fix)
    phase: str = "config"  # config: refused before any run dir exists; run: refused by the run
    env: dict[str, str] = field(default_factory=dict)
    torch: bool = False  # a config case that may import torch (judged by the method's code)
    unprivileged: bool = False  # file permissions must apply (under root: run without its overrides)
    files: tuple[tuple[str, str], ...] = ()  # (name, text) written into the case's cwd first
    trains: bool = False  # refused after training started: the progress bar's lines come first
    locked: tuple[
        str, ...
    ] = ()  # dirs of the case's cwd whose .lock a live process holds (flock) while it runs


def C(id: str, args: str, says: str, phase: str = "config", **kw) -> Case:
    return Case(id, tuple(args.split()), says, phase, **kw)


def T(id: str, args: str, says: str, **kw) -> Case:
    """A config case judged by the method's code (imports torch; still before any run dir)."""
    return C(id, args, says, torch=True, **kw)


def U(id: str, args: str, says: str, phase: str = "config", **kw) -> Case:
    """A case about file permissions (unreadable dirs and files, a read-only HOME)."""
    return C(id, args, says, phase, unprivileged=True, **kw)


CASES: list[Case] = [
    # --- required values, missing files and dirs (visible in the config) ---
    C("jsonl-no-path", "train data=jsonl", "data.train_path is required"),
    C("local-no-path", "train model=local", "model.path is required"),
    C(
        "jsonl-missing-file",
        "train data=jsonl data.train_path={F}/nope.jsonl",
        "data.train_path={F}/nope.jsonl: not found",
    ),
    C("jsonl-path-is-dir", "train data=jsonl data.train_path={F}", "is a directory"),
    C(
        "jsonl-missing-eval",
        "train data=jsonl data.train_path={F}/good.jsonl data.eval_path={F}/nope.jsonl",
        "data.eval_path",
    ),
    C("local-missing-dir", "train model=local model.path={F}/no_model", "not a save_pretrained directory"),
    # the cheat-sheet's relative form before the dir exists: a path, never tried as a hub id (HFValidationError)
    C(
        "local-relative-missing",
        "train model=local model.path=outputs/nowhere/model",
        "model.path=outputs/nowhere/model is not a save_pretrained directory (not found; read as a local path",
    ),
    C(
        "local-relative-no-such-folder",
        "train model=local model.path=calc_sft/run/model",
        "model.path=calc_sft/run/model is not a save_pretrained directory (not found; read as a local path: it "
        "cannot be a hub id (NAME or ORG/NAME))",
    ),
    T(
        "reward-model-relative-missing",
        "train method=grpo +data.reward_funcs.rm._target_=ablate.rewards.RewardModel "
        "+data.reward_funcs.rm.path=outputs/rm/model",
        "RewardModel: path outputs/rm/model does not exist",
    ),
    C("local-empty-dir", "train model=local model.path={F}/empty_dir", "no config.json"),
    C("local-bad-dtype", "train model=local model.path={F}/empty_dir model.dtype=float8", "model.dtype"),
    # --- values of the wrong type or out of range ---
    C("beta-abc", "train method.args.beta=abc", "method.args.beta=abc: must be a number > 0"),
    C("beta-zero", "train method.args.beta=0", "method.args.beta=0"),
    C("beta-negative", "train method.args.beta=-0.1", "method.args.beta=-0.1"),
    C("hinge-beta-zero", "train method=dpo_hinge method.args.beta=0", "method.args.beta=0"),
    C("grpo-beta-negative", "train method=grpo method.args.beta=-1", "method.args.beta=-1"),
    C(
        "lr-negative",
        "train optimizer.optimizer.lr=-1e-3",
        "optimizer.optimizer.lr=-0.001: must be a number > 0",
    ),
    C("lr-zero", "train optimizer.optimizer.lr=0", "optimizer.optimizer.lr=0"),
    C("lr-text", "train optimizer.optimizer.lr=fast", "optimizer.optimizer.lr=fast"),
    C("sgd-lr-negative", "train optimizer=sgd optimizer.optimizer.lr=-1", "optimizer.optimizer.lr=-1"),
    C("weight-decay-negative", "train optimizer.optimizer.weight_decay=-1", "weight_decay"),
    C(
        "batch-zero",
        "train method.args.per_device_train_batch_size=0",
        "per_device_train_batch_size=0: must be an integer >= 1",
    ),
    C("batch-negative", "train method.args.per_device_train_batch_size=-4", "per_device_train_batch_size=-4"),
    C("batch-float", "train method.args.per_device_train_batch_size=2.5", "per_device_train_batch_size=2.5"),
    C("eval-batch-zero", "train method.args.per_device_eval_batch_size=0", "per_device_eval_batch_size=0"),
    C("accum-zero", "train method.args.gradient_accumulation_steps=0", "gradient_accumulation_steps=0"),
    C("max-length-zero", "train method.args.max_length=0", "max_length=0"),
    C("sft-max-length-zero", "train method=sft method.args.max_length=0", "max_length=0"),
    C("epochs-zero", "train method.args.num_train_epochs=0", "num_train_epochs=0"),
    C("max-steps-zero", "train method.args.max_steps=0", "max_steps=0: must be -1"),
    C("max-steps-negative", "train method.args.max_steps=-5", "max_steps=-5"),
    C("save-steps-zero", "train method.args.save_steps=0", "save_steps=0"),
    C("logging-steps-zero", "train method.args.logging_steps=0", "logging_steps=0"),
    C(
        "eval-strategy-unknown",
        "train method.args.eval_strategy=sometimes",
        "eval_strategy=sometimes: must be one of",
    ),
    C("save-strategy-unknown", "train method.args.save_strategy=never", "save_strategy=never"),
    C("save-limit-zero", "train method.args.save_total_limit=0", "save_total_limit=0"),
    C("grad-norm-negative", "train method.args.max_grad_norm=-1", "max_grad_norm=-1"),
    C("workers-negative", "train method.args.dataloader_num_workers=-1", "dataloader_num_workers=-1"),
    C("grpo-one-generation", "train method=grpo method.args.num_generations=1", "num_generations=1"),
    C("grpo-temperature-zero", "train method=grpo method.args.temperature=0", "temperature=0"),
    C("grpo-top-p-big", "train method=grpo method.args.top_p=1.5", "top_p=1.5"),
    C(
        "grpo-completion-zero",
        "train method=grpo method.args.max_completion_length=0",
        "max_completion_length=0",
    ),
    C("grpo-spg-zero", "train method=grpo method.args.steps_per_generation=0", "steps_per_generation=0"),
    C(
        "grpo-generation-dtype-sync",
        "train method=grpo method.args.generation_dtype=bfloat16",
        "generation_dtype=bfloat16: must be null, float32 or bfloat16, with method.args.max_staleness > 0",
    ),
    C(
        "grpo-generation-dtype-unknown",
        "train method=grpo method.args.max_staleness=1 method.args.generation_dtype=bf16",
        "generation_dtype=bf16",
    ),
    C(
        "grpo-async-threads-sync",
        "train method=grpo method.args.async_threads=balanced",
        "async_threads=balanced: must be split, or balanced with method.args.max_staleness > 0",
    ),
    C(
        "grpo-async-threads-unknown",
        "train method=grpo method.args.max_staleness=1 method.args.async_threads=all",
        "async_threads=all",
    ),
    C(
        "grpo-scale-unknown",
        "train method=grpo method.args.scale_rewards=sometimes",
        "scale_rewards=sometimes",
    ),
    C("grpo-epsilon-negative", "train method=grpo method.args.epsilon=-0.1", "epsilon=-0.1"),
    C("seed-text", "train seed=abc", "seed=abc: must be an integer"),
    C("peak-tflops-zero", "train peak_tflops=0", "peak_tflops=0: must be null (measured) or a number > 0"),
    C("max-samples-zero", "train data.max_train_samples=0", "max_train_samples=0"),
    C("env-unset", "train seed=${oc.env:ABLATE_SURELY_UNSET}", "ABLATE_SURELY_UNSET"),
    # --- typos: unknown keys, groups and options; the key meant is named ---
    C("root-typo-added", "train +precison=bf16", "did you mean 'precision'"),
    C("root-typo-dotted", "train +optimzer.lr=1", "did you mean 'optimizer'"),
    C("root-typo-seed", "train +sed=3", "did you mean 'seed'"),
    C("root-unknown", "train +zzz_qqq=1", "unknown root key 'zzz_qqq'"),
    C("args-typo", "train method.args.bta=1", "did you mean 'method.args.beta'"),
    C("method-typo", "train method.bta=1", "unknown config key 'method.bta'"),
    C("lr-typo", "train optimizer.optimizer.lrr=1", "did you mean 'optimizer.optimizer.lr'"),
    C("seed-typo", "train sed=1", "did you mean 'seed'"),
    C("callback-typo", "train callbacks.nan_gard=null", "did you mean 'callbacks.nan_guard'"),
    T("args-unknown-added", "train +method.args.bta=1", "did you mean 'method.args.beta'"),
    # a key that exists under another node is named by its full path, with or without '+' (issue 37:
    # `max_steps=5` suggested `+max_steps=5`, which was then refused as an unknown root key)
    C(
        "key-elsewhere",
        "train max_steps=5",
        "unknown config key 'max_steps': 'max_steps' is method.args.max_steps: write method.args.max_steps=5",
    ),
    C(
        "key-elsewhere-added",
        "train +max_steps=5",
        "'max_steps' is method.args.max_steps: write method.args.max_steps=5",
    ),
    C(
        "lr-under-method-args",
        "train method.args.lr=1e-3",
        "'lr' is optimizer.optimizer.lr: write optimizer.optimizer.lr=1e-3",
    ),
    T(
        "lr-under-method-args-added",
        "train +method.args.lr=1e-3",
        "method.args.lr: DPOConfig has no such field; 'lr' is optimizer.optimizer.lr: write optimizer.optimizer.lr=0.001",
    ),
    C("beta-at-the-root", "train beta=0.2", "'beta' is method.args.beta: write method.args.beta=0.2"),
    C("method-option-typo", "train method=dpoo", "did you mean method=dpo"),
    C("model-option-typo", "train model=tinyy", "did you mean model=tiny"),
    C("data-option-typo", "train data=tiny_pref", "did you mean data=tiny_prefs"),
    C("precision-option-typo", "train precision=fp33", "precision=fp32"),
    C("scheduler-option-typo", "train optimizer/scheduler=cosin", "optimizer/scheduler=cosine"),
    C("experiment-typo", "train +experiment=hinge_stron", "experiment=hinge_strong"),
    C("launcher-typo", "train hydra/launcher=slurmm", "hydra/launcher=slurm"),
    C("perf-typo", "train speed.padding_fre=false", "did you mean 'speed.padding_free'"),
    C("perf-option-typo", "train speed=of", "did you mean speed=off"),
    # --- a key written under another node: the one line names where it is ---
    C(
        "elsewhere-padding-free",
        "train method.args.padding_free=false",
        "unknown config key 'method.args.padding_free': 'padding_free' is speed.padding_free: write speed.padding_free=false",
    ),
    C(
        "elsewhere-lean-layers",
        "train model.lean_layers=false",
        "'lean_layers' is speed.lean_layers: write speed.lean_layers=false",
    ),
    C(
        "elsewhere-group",
        "train perf=off",
        "unknown config key 'perf': 'perf' is picked by the config group speed: "
        "write speed=off (options: conf/speed/)",
    ),
    C(
        "append-existing",
        "train +seed=1",
        "+seed: seed is already a key of this config (its default is declared): set it without the +, seed=1",
    ),
    C("override-unparsable", "train method.args.beta=[1", "method.args.beta=[1"),
    # --- paths: run dirs that cannot be used ---
    C("run-dir-is-file", "train hydra.run.dir={F}/a_file", "is a file, not a directory"),
    C("run-dir-under-file", "train hydra.run.dir={F}/a_file/run", "is a file, not a directory"),
    C(
        "run-dir-uncreatable", "train hydra.run.dir=/proc/ablate_no/run", "cannot create it", torch=True
    ),  # found by mkdir, after the code checks
    C("sweep-dir-is-file", "train -m seed=1,2 hydra.sweep.dir={F}/a_file", "hydra.sweep.dir"),
    C("old-run-dir-bad-beta", f"train hydra.run.dir={OLD} method.args.beta=abc", "method.args.beta=abc"),
    C("old-run-dir-root-typo", f"train hydra.run.dir={OLD} +precison=bf16", "did you mean 'precision'"),
    C("old-run-dir-no-path", f"train hydra.run.dir={OLD} data=jsonl", "data.train_path is required"),
    # --- sweep files, resume, compare ---
    C("sweep-malformed", "sweep {F}/sweep/malformed.yaml", "malformed.yaml line 5, column 1: not valid YAML"),
    C("sweep-not-utf8", "sweep {F}/sweep/latin1.yaml", "not UTF-8"),
    C("sweep-missing", "sweep {F}/nope.yaml", "no sweep file '{F}/nope.yaml'"),
    C("sweep-bad-value", "sweep dpo_loss method.args.beta=0", "method.args.beta=0"),
    C("sweep-bad-fixed-typo", "sweep dpo_loss +precison=bf16", "did you mean 'precision'"),
    C("resume-not-a-run", "resume {F}/empty_dir", "not an ablate run dir"),
    # --- a JSON-lines file's rows (read before the run dir exists: nothing created) ---
    C("jsonl-not-utf8", "train data=jsonl data.train_path={F}/latin1.jsonl", "not UTF-8", "config"),
    C(
        "jsonl-bad-json",
        "train data=jsonl data.train_path={F}/bad_json.jsonl",
        "line 2 is not valid JSON",
        "config",
    ),
    C(
        "jsonl-array-row",
        "train data=jsonl data.train_path={F}/array.jsonl",
        "is a JSON list, not an object",
        "config",
    ),
    C("jsonl-empty", "train data=jsonl data.train_path={F}/empty.jsonl", "has no examples", "config"),
    # ===== issue 22: tracebacks before =====
    C(
        "betas-out-of-range",
        "train optimizer.optimizer.betas=[0.9,1.5]",
        "optimizer.optimizer.betas=[0.9,1.5]: must be two numbers in [0, 1)",
    ),
    C(
        "betas-one-value",
        "train optimizer.optimizer.betas=[0.9]",
        "optimizer.optimizer.betas=[0.9]: must be two numbers",
    ),
    C("seed-negative", "train seed=-1", "seed=-1: must be an integer in 0..4294967295"),
    C("seed-too-big", "train seed=99999999999", "seed=99999999999: must be an integer in 0..4294967295"),
    C(
        "eval-without-eval-data",
        "train data=jsonl data.train_path={F}/good.jsonl method.args.eval_strategy=steps",
        "method.args.eval_strategy=steps but the data has no eval split: add data.eval_path=",
    ),
    C(
        "grpo-top-k-negative",
        "train method=grpo method.args.top_k=-1",
        "method.args.top_k=-1: must be an integer >= 0",
    ),
    C(
        "hidden-size-odd",
        "train model.hidden_size=63",
        "model.hidden_size=63: must be an integer >= 1 divisible by model.num_heads=4",
    ),
    C("lora-rank-zero", "train +peft=lora peft.r=0", "peft.r=0: must be an integer >= 1"),
    C(
        "lora-target-modules-empty",
        "train +peft=lora peft.target_modules=[]",
        "peft.target_modules=[]: must be all-linear or a list",
    ),
    C(
        "threads-text",
        "train threads=abc",
        "threads=abc: must be null (the cores available) or an integer >= 1",
    ),
    C(
        "wandb-mode-typo",
        "train logger=wandb logger.mode=onlin",
        "logger.mode=onlin: must be one of online, offline, disabled",
    ),
    C(
        "early-stop-mode",
        "train callbacks=[default,early_stop] callbacks.early_stop.mode=maximum",
        "callbacks.early_stop.mode=maximum: must be min (lower is better) or max",
    ),
    C(
        "early-stop-patience",
        "train callbacks=[default,early_stop] callbacks.early_stop.patience=0",
        "callbacks.early_stop.patience=0",
    ),
    C(
        "target-typo",
        "train method.trainer._target_=ablate.methods.dpo.DPOTrainr",
        "no 'DPOTrainr' in module ablate.methods.dpo (did you mean ablate.methods.dpo.DPOTrainer?)",
    ),
    C(
        "target-typo-loss",
        "train method.dpo_loss._target_=ablate.losses.dpo.sigmod",
        "did you mean ablate.losses.dpo.sigmoid?",
    ),
    C(
        "target-no-module",
        "train method.dpo_loss._target_=ablate.lossez.dpo.sigmoid",
        "no 'lossez' in module ablate",
    ),
    C("resume-empty-run-json", "resume {F}/empty_run_json", "run.json records no overrides"),
    C("resume-run-json-list", "resume {F}/list_run_json", "is corrupt (not a JSON object)"),
    U("resume-unreadable", "resume {F}/unreadable_run", "unreadable_run: permission denied"),
    U("compare-unreadable", "compare {F}/unreadable_run", "unreadable_run: permission denied"),
    U("status-unreadable", "status {F}/unreadable_run", "unreadable_run: permission denied"),
    U("generate-unreadable", "generate {F}/unreadable_run --prompt hi", "unreadable_run: permission denied"),
    C(
        "generate-empty-prompts-file",
        "generate {F}/done_run --prompts {F}/empty.jsonl",
        "--prompts {F}/empty.jsonl is empty: no rows in it",
    ),
    U("eval-unreadable", "eval {F}/unreadable_run", "unreadable_run: permission denied"),
    U(
        "run-dir-under-unsearchable",
        "train hydra.run.dir={F}/unsearchable/run",
        "hydra.run.dir={F}/unsearchable/run: permission denied",
    ),
    # ===== issue 22: silently accepted before =====
    C(
        "min-ratio-negative",
        "train optimizer.scheduler.min_ratio=-1",
        "optimizer.scheduler.min_ratio=-1: must be a fraction of the peak lr in [0, 1]",
    ),
    C(
        "lr-in-method-args",
        "train +method.args.learning_rate=1e-5",
        "method.args.learning_rate is not used: the optimizer group builds the optimizer and its schedule",
    ),
    C(
        "warmup-in-method-args",
        "train +method.args.warmup_ratio=0.1",
        "use optimizer.scheduler.warmup_ratio=0.1",
    ),
    C("optim-in-method-args", "train +method.args.optim=sgd", "use optimizer=adamw|adamw_8bit|sgd"),
    C("tags-not-a-list", "train tags=baseline", "tags=baseline: must be a list: tags=[baseline]"),
    C(
        "run-dir-empty",
        "train hydra.run.dir=",
        "hydra.run.dir is empty (it would write into the current directory)",
    ),
    C("sweep-dir-empty", "train -m seed=1,2 hydra.sweep.dir=", "hydra.sweep.dir is empty"),
    C("num-layers-zero", "train model.num_layers=0", "model.num_layers=0: must be an integer >= 1"),
    C(
        "label-smoothing-two",
        "train method/dpo_loss=robust method.dpo_loss.label_smoothing=2",
        "method.dpo_loss.label_smoothing=2: must be a number in [0, 0.5)",
    ),
    # the template's fault, named (not row 0's), before the run dir exists
    T(
        "assistant-only-template-renders-no-assistant",
        "train method=sft data=caps_messages method.args.assistant_only_loss=true model=local "
        "model.path={F}/user_only_template",
        "method.args.assistant_only_loss=true, but the chat template of model.path={F}/user_only_template "
        "(chat_template.jinja) puts no token of an assistant turn in the loss",
    ),
    # a reference for a loss that reads none (ORPO, CPO, SimPO) would be loaded and dropped unread
    T(
        "orpo-ref-model-live",
        "train method=orpo +ref_model=live",
        "+ref_model with method=orpo: its loss (ablate.losses.reference_free.orpo) is reference-free",
    ),
    T(
        "simpo-ref-model-live",
        "train method=simpo +ref_model=live",
        "+ref_model with method=simpo: its loss (ablate.losses.reference_free.simpo) is reference-free",
    ),
    C(
        "orpo-beta-negative",
        "train method=orpo method.args.beta=-1",
        "method.args.beta=-1: must be a number > 0",
    ),
    C(
        "shrink-on-tiny",
        "train model=tiny +shrink=tiny",
        "model.config_overrides=+shrink or a mapping: must be unset with ablate.models.tiny",
    ),
    C(
        "cpo-alpha-negative",
        "train method=cpo method.dpo_loss.cpo_alpha=-1",
        "method.dpo_loss.cpo_alpha=-1: must be a number >= 0 (the NLL term's weight; 0 = off)",
    ),
    C(
        "simpo-gamma-text",
        "train method=simpo method.dpo_loss.gamma=big",
        "method.dpo_loss.gamma=big: must be a number >= 0",
    ),
    C("use-cpu-maybe", "train method.args.use_cpu=maybe", "method.args.use_cpu=maybe: must be true or false"),
    T(
        "bool-field-text",
        "train +method.args.skip_memory_metrics=sometimes",
        "method.args.skip_memory_metrics=sometimes: must be true or false",
    ),
    # a typed field of a schema (Hydra composes method.args from it): OmegaConf refuses the type while
    # composing, in the schema's words
    C("typed-float-text", "train method.args.beta=abc", "method.args.beta=abc: must be a number > 0"),
    C(
        "typed-int-fraction",
        "train method.args.max_steps=2.5",
        "method.args.max_steps=2.5: must be -1 (use num_train_epochs) or an integer >= 1",
    ),
    C(
        "typed-list-scalar",
        "train method=grpo method.args.tools=3",
        "method.args.tools=3: must be null or a list of functions",
    ),
    C(
        "typed-speed-switch",
        "train speed.padding_free=sometimes",
        "speed.padding_free=sometimes: must be true or false",
    ),
    C(
        "declared-bool-text",
        "train method.args.gradient_checkpointing=sometimes",
        "method.args.gradient_checkpointing=sometimes: must be null or true or false",
    ),
    C(
        "plus-on-a-declared-key",
        "train +method.args.eval_on_start=true",
        "+method.args.eval_on_start: method.args.eval_on_start is already a key of this config (its default is "
        "declared): set it without the +, method.args.eval_on_start=true",
    ),
    C(
        "warmup-ratio-two",
        "train optimizer.scheduler.warmup_ratio=2",
        "optimizer.scheduler.warmup_ratio=2: must be a fraction",
    ),
    C(
        "warmup-ratio-negative",
        "train optimizer.scheduler.warmup_ratio=-0.5",
        "optimizer.scheduler.warmup_ratio=-0.5",
    ),
    C(
        "sft-role-robot",
        "train method=sft data=jsonl data.train_path={F}/robot.jsonl",
        "has a message with role 'robot', which chat templates do not know",
        "run",
    ),
    C(
        "sft-role-sharegpt",
        "train method=sft data=jsonl data.train_path={F}/human_gpt.jsonl",
        "rename it to 'user'",
        "run",
    ),
    C(
        "dpo-empty-strings",
        "train data=jsonl data.train_path={F}/empty_strings.jsonl",
        "'chosen' is empty",
        "run",
    ),
    C(
        "compare-metric-typo",
        "compare {F}/done_run --metric rewards/accuracy",
        "--metric rewards/accuracy: no run under {F}/done_run has it (did you mean --metric rewards/accuracies?",
    ),
    C(
        "jsonl-huge-line",
        "train data=jsonl data.train_path={F}/huge_line.jsonl",
        "line 1 is 1.5 MiB, over data.max_line_bytes=1048576",
        "config",
    ),
    # ===== issue 22: config mistakes refused only after the run dir existed =====
    T("fp16-on-cpu", "train precision=fp16", "precision=fp16 needs a CUDA GPU"),
    T("tf32-on-cpu", "train precision.tf32=true", "precision.tf32=true needs an Ampere or newer CUDA GPU"),
    T(
        "liger-on-cpu",
        "train speed.liger=true",
        "speed.liger=true: Liger's kernels are Triton kernels for CUDA GPUs",
    ),
    C("compile-not-bool", "train speed.compile=maybe", "speed.compile=maybe: must be true or false"),
    T(
        "fsdp-one-process",
        "train distributed=fsdp",
        "distributed=fsdp shards the model over several processes",
    ),
    C(
        "grpo-batch-not-multiple",
        "train method=grpo method.args.per_device_train_batch_size=12",
        "method.args.per_device_train_batch_size=12: must be an integer >= 1 and a multiple of method.args.num_generations=8",
    ),
    C(
        "grpo-eval-batch-not-multiple",
        "train method=grpo method.args.eval_strategy=steps method.args.per_device_eval_batch_size=12",
        "method.args.per_device_eval_batch_size=12",
    ),
    C(
        "grpo-num-iterations-zero",
        "train method=grpo method.args.num_iterations=0",
        "method.args.num_iterations=0: must be an integer >= 1",
    ),
    C(
        "grpo-delta-small",
        "train method=grpo method.args.delta=0.5",
        "method.args.delta=0.5: must be null or a number > 1 + epsilon_high",
    ),
    C(
        "grpo-reward-weights-length",
        "train method=grpo method.args.reward_weights=[1,2,3]",
        "must be null or a list of 1 numbers, one per data.reward_funcs entry (repeat_fraction)",
    ),
    C(
        "grpo-sampling-level",
        "train method=grpo method.args.importance_sampling_level=sentence",
        "method.args.importance_sampling_level=sentence: must be token (GRPO) or sequence (GSPO)",
    ),
    T(
        "dpo-loss-under-grpo",
        "train method=grpo method.grpo_aggregation._target_=ablate.losses.dpo.hinge",
        "method.grpo_aggregation._target_=ablate.losses.dpo.hinge does not fit method=grpo: GRPOTrainer calls its aggregation like "
        "ablate.losses.grpo.dapo(",
    ),
    C(
        "dpo-loss-group-under-grpo",
        "train method=grpo method/dpo_loss=hinge",
        "method/dpo_loss=hinge: this config has no "
        "config group method/dpo_loss (options of method that have it: cpo, dpo,",
    ),
    T(
        "grpo-loss-target-under-dpo",
        "train method.dpo_loss._target_=ablate.losses.grpo.dapo",
        "method.dpo_loss._target_=ablate.losses.grpo.dapo does not fit method=dpo: DPOTrainer calls its loss like "
        "ablate.losses.dpo.sigmoid(logp_c",
    ),
    C(
        "grpo-loss-under-dpo",
        "train method/dpo_loss=dapo",
        "no option 'dapo' in config group 'method/dpo_loss' (dapo is an "
        "option of method/grpo_aggregation: method/grpo_aggregation=dapo;",
    ),
    C("threads-zero", "train threads=0", "threads=0: must be null"),
    C("threads-negative", "train threads=-2", "threads=-2: must be null"),
    C(
        "malloc-negative",
        "train malloc_mmap_threshold=-1",
        "malloc_mmap_threshold=-1: must be null (malloc's default) or bytes in 0..33554432",
    ),
    # ===== issue 22: multi-line or unhelpful before =====
    C("command-typo", "trian", "'trian' is not a command (did you mean 'ablate train'?"),
    C("option-as-command", "--verbose", "'--verbose' is not an option"),
    C(
        "override-with-dashes",
        "train --method=dpo",
        "'--method=dpo' is not an option: overrides take no dashes: write method=dpo",
    ),
    C("cfg-value-typo", "train --cfg jobs", "--cfg takes job|hydra|all, got 'jobs'"),
    C("unknown-option", "train --dry-run", "'--dry-run' is not an option of ablate train"),
    C(
        "hub-model-unreachable",
        "train model=qwen2_5_0_5b",
        "model.path=Qwen/Qwen2.5-0.5B-Instruct: not in the local cache and 127.0.0.1 cannot be reached",
        "run",
        env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"},
    ),
    C(
        "hub-model-offline",
        "train model=qwen2_5_0_5b",
        "model.path: cannot load 'Qwen/Qwen2.5-0.5B-Instruct'",
        "run",
        env={"HF_HUB_OFFLINE": "1"},
    ),
    C(
        "hub-data-unreachable",
        "train data=ultrafeedback_binarized",
        "data: cannot load 'trl-lib/ultrafeedback_binarized': 127.0.0.1 cannot be reached",
        "run",
        env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"},
    ),
    T(
        "preview-bad-file",
        "data preview data=jsonl data.train_path={F}/mixed.jsonl",
        "mixed.jsonl line 2 is a messages row, line 1 a preference (chosen, rejected) row: one format per file",
    ),
    C(
        "preview-missing-file",
        "data preview data=jsonl data.train_path={F}/nope.jsonl",
        "data.train_path={F}/nope.jsonl: not found",
    ),
    C(
        "home-path-unquoted",
        "train data=jsonl data.train_path=~/x.jsonl",
        "Hydra reads '~' only inside quotes: write 'data.train_path=\"~/x.jsonl\"'",
    ),
    C(
        "warmup-steps-in-args",
        "train method.args.warmup_steps=10",
        "method.args.warmup_steps is not used: the optimizer group "
        "builds the optimizer and its schedule (Trainer's own warmup_steps is ignored); use optimizer/scheduler=constant",
    ),
    U(
        "read-only-home",
        "train",
        "the datasets cache {F}/ro_home/hf/datasets cannot be written",
        env={"HOME": "{F}/ro_home", "HF_HOME": "{F}/ro_home/hf", "XDG_CACHE_HOME": "{F}/ro_home/cache"},
    ),
    U(
        "data-file-unreadable",
        "train data=jsonl data.train_path={F}/unreadable.jsonl",
        "data.train_path={F}/unreadable.jsonl: not readable (permission denied)",
    ),
    U(
        "eval-file-unreadable",
        "train data=jsonl data.train_path={F}/good.jsonl data.eval_path={F}/unreadable.jsonl",
        "data.eval_path={F}/unreadable.jsonl: not readable",
    ),
    # data=mix: a source's file is read before the run dir exists, as data=local's (docs/data.md)
    C(
        "mix-empty-source",
        "train data=mix +data@data.sources.mine=local data.sources.mine.train_path={F}/empty.jsonl",
        "data.sources.mine: train file {F}/empty.jsonl has no examples",
    ),
    C(
        "mix-half-pair-line-7",
        "train data=mix +data@data.sources.mine=local data.sources.mine.train_path={F}/half_pair.jsonl",
        "data.sources.mine: {F}/half_pair.jsonl line 7 has half a pair (chosen only (no rejected)), line 1 a "
        "whole preference (chosen, rejected) row",
    ),
    C(
        "mix-bad-json-line-7",
        "train data=mix +data@data.sources.mine=local data.sources.mine.train_path={F}/bad_json_7.jsonl",
        "data.sources.mine: {F}/bad_json_7.jsonl line 7 is not valid JSON (Expecting property name enclosed in "
        "double quotes at column 39)",
    ),
    C(
        "jsonl-half-pair",
        "train data=jsonl data.train_path={F}/half_pair.jsonl",
        "data: {F}/half_pair.jsonl line 7 has half a pair (chosen only (no rejected))",
    ),
    C(
        "jsonl-mixed-formats",
        "train data=jsonl data.train_path={F}/mixed.jsonl",
        "one format per file",
        "config",
    ),
    T(
        "lora-target-modules-unknown",
        "train +peft=lora peft.target_modules=[nosuch_proj]",
        "no such layer in this model; its linear layers: down_proj, gate_proj, k_proj",
        phase="run",
    ),
    # ===== issue 23 (4, 12) and the reorganisation's moved _target_s =====
    C(
        "lr-quoted",
        "train optimizer.optimizer.lr='1e-3'",
        "optimizer.optimizer.lr='1e-3' is a string (quoted), not a "
        "number: write it unquoted, optimizer.optimizer.lr=1e-3",
    ),
    C(
        "lr-quoted-in-yaml",
        "train --config-dir {F}/conf +experiment=quoted_lr",
        "optimizer.optimizer.lr='1e-3' is a string (quoted), not a number",
    ),
    C(
        "user-module-not-importable",
        "train method.dpo_loss._target_=my_losses.squared",
        "method.dpo_loss._target_=my_losses.squared: module 'my_losses' is not importable",
    ),
    C(
        "user-module-in-cwd",
        "train method.dpo_loss._target_=cwd_losses.squared",
        files=(("cwd_losses.py", SQUARED),),
        says="module 'cwd_losses' is in the current directory (cwd_losses.py), which the `ablate` command does not import from; "
        "run it as PYTHONPATH=. ablate",
    ),
    # ===== issue 36: a user's own reward functions (the short form, found in the current directory) =====
    C(
        "reward-short-form-typo",
        "train method=grpo data=jsonl data.train_path={F}/good.jsonl data.reward_funcs=[cwd_rew.shrt]",
        "data.reward_funcs[0]=cwd_rew.shrt: no 'shrt' in module cwd_rew (did you mean cwd_rew.short?)",
        files=(("cwd_rew.py", SHORT_REWARD),),
    ),
    C(
        "reward-short-form-no-module",
        "train method=grpo data=jsonl data.train_path={F}/good.jsonl data.reward_funcs=[nomod.short]",
        "data.reward_funcs[0]=nomod.short: no module 'nomod' on the import path or in the current directory",
    ),
    C(
        "reward-target-in-cwd-typo",
        "train method=grpo data=jsonl data.train_path={F}/good.jsonl "
        "+data.reward_funcs.s._target_=cwd_rew.shrt",
        "no 'shrt' in module cwd_rew",
        files=(("cwd_rew.py", SHORT_REWARD),),
    ),
    C(
        "tool-not-found",
        "train method=grpo data=calc_tools method.args.tools=[nomod.calc]",
        "method.args.tools[0]=nomod.calc: no module 'nomod' on the import path or in the current directory",
    ),
    C(
        "tool-call-format",
        "train method=grpo data=calc_tools method.args.tool_call_format=xml",
        "method.args.tool_call_format=xml: must be auto, chat_template or hermes",
    ),
    C(
        "environment-async",
        "train method=grpo data=calc_tools method.args.max_staleness=1 "
        "method.args.environment={_target_:ablate.tools.calculator}",
        "the async worker would hold the environments",
    ),
    T(
        "tool-undocumented",
        "train method=grpo data=calc_tools method.args.tools=[cwd_tool.f]",
        "method.args.tools[0]: tool f needs type hints and a docstring",
        files=(("cwd_tool.py", "def f(x):\n    return x\n"),),
        phase="run",
    ),
    C(
        "target-old-module",
        "train method.trainer._target_=ablate.trainers.dpo.DPOTrainer",
        "method.trainer._target_=ablate.trainers.dpo.DPOTrainer: no 'trainers' in module ablate (did you mean ablate.train?)",
    ),
    C(
        "target-old-name",
        "train +callbacks.jsonl._target_=ablate.callbacks.MetricsJSONL",
        "callbacks.jsonl._target_=ablate.callbacks.MetricsJSONL: no 'MetricsJSONL' in module ablate.callbacks",
    ),
    C(
        "target-in-config-dir",
        "train --config-dir {F}/conf method=old_dpo",
        "method.trainer._target_=ablate.trainers.dpo.DPOTrainer: no 'trainers' in module ablate",
    ),
    # ===== issue 32: never touch what ablate did not write =====
    C(
        "cache-env-is-file",
        "train",
        "ABLATE_CACHE={F}/a_file is a file, not a directory",
        env={"ABLATE_CACHE": "{F}/a_file"},
    ),
    C(
        "cache-dir-under-file",
        "train cache.dir={F}/a_file/c",
        "cache.dir={F}/a_file/c is a file, not a directory ({F}/a_file is a file)",
    ),
    C(
        "sweep-into-a-sweep",
        "train -m seed=1,2 hydra.sweep.dir=sw",
        "hydra.sweep.dir=sw holds a sweep (multirun.yaml): "
        "continue it with `ablate sweep --resume sw`, or choose another hydra.sweep.dir",
        files=SWEEP_FILES,
    ),
    C(
        "sweep-file-into-a-sweep",
        "sweep dpo_loss hydra.sweep.dir=sw",
        "hydra.sweep.dir=sw holds a sweep",
        files=SWEEP_FILES,
    ),
    C(
        "sweep-into-a-study",
        "train -m seed=1,2 hydra.sweep.dir=sw",
        "hydra.sweep.dir=sw holds a sweep (study.db)",
        files=(("sw/study.db", "SQLite format 3"),),
    ),
    # ===== issue 35: the new methods' arguments, each checked once, in its schema (ablate.schema.args, .grpo): before torch =====
    C(
        "reward-center-negative",
        "train method=reward method.args.center_rewards_coefficient=-1",
        "method.args.center_rewards_coefficient=-1: must be null (off) or a number >= 0",
    ),
    C(
        "kto-weight-zero",
        "train method=kto method.args.undesirable_weight=0",
        "method.args.undesirable_weight=0: must be a number > 0",
    ),
    C(
        "kto-random-order",
        "train method=kto method.args.train_sampling_strategy=random",
        "method.args.train_sampling_strategy=random: must be sequential (the KL pairs are fixed in the data's order",
    ),
    C(
        "kto-batch-of-one",
        "train method=kto method.args.per_device_train_batch_size=1",
        "method.args.per_device_train_batch_size=1: must be an integer >= 2 (KTO's KL estimate",
    ),
    C(
        "rloo-clip-range-reversed",
        "train method=rloo method.args.reward_clip_range=[1,0]",
        "method.args.reward_clip_range=[1,0]: must be null or [min, max] with min <= max",
    ),
    C(
        "rloo-sequence-level",
        "train method=rloo method.args.importance_sampling_level=sequence",
        "method.args.importance_sampling_level=sequence: must be token (GRPO's option: RLOO's ratio is always one per "
        "completion)",
    ),
    C(
        "distill-beta-above-one",
        "train method=distill method.args.beta=1.5",
        "method.args.beta=1.5: must be a number in [0, 1] (0 = forward KL, 1 = reverse KL)",
    ),
    C("distill-teacher-without-path", "train method=distill +teacher=local", "teacher.path"),
    # a study (hydra/sweeper=optuna): a sweep dir after the name, a damaged study.db, a second driver: at once, nothing written
    C(
        "study-resume-dir-after-name",
        "sweep tune_dpo_beta_lr hydra.sweeper.n_trials=2 --resume sw",
        "'sw' is a sweep dir: "
        "--resume takes the sweep dir in place of the sweep's name: ablate sweep --resume sw [key=value ...]",
        files=STUDY_FILES,
    ),
    C(
        "sweep-stray-word",
        "sweep dpo_loss seed=1 foo",
        "'foo' is not an override: after the sweep's name come key=value overrides",
    ),
    C(
        "study-db-truncated",
        "sweep --resume sw",
        "sw/study.db is not a readable Optuna study (database disk image is malformed); nothing was changed",
        files=STUDY_TRUNCATED,
    ),
    C(
        "study-db-not-sqlite",
        "sweep --resume sw",
        "sw/study.db is not a readable Optuna study (file is not a database)",
        files=(("sw/multirun.yaml", STUDY), ("sw/study.db", "my notes\n" * 200)),
    ),
    C(
        "study-second-driver",
        "sweep --resume sw",
        "/sw is in use by PID 4242 on host otherbox; wait for it to end",
        files=STUDY_FILES,
        locked=("sw",),
    ),
    # a reward function of the user's (tests/bad_rewards.py) that breaks its contract: one line naming it
    C(
        "reward-raises",
        f"{REWARD}=bad_rewards.raises {GRPO1}",
        "reward function 'mine' (bad_rewards.raises) raised "
        "ValueError: my reward broke on purpose (traceback: ",
        "run",
        trains=True,
    ),
    C(
        "reward-one-short",
        f"{REWARD}=bad_rewards.one_short {GRPO1}",
        "reward function 'mine' (bad_rewards.one_short) returned 63 rewards for 64 completions",
        "run",
        trains=True,
    ),
    C(
        "reward-strings",
        f"{REWARD}=bad_rewards.strings {GRPO1}",
        "reward function 'mine' (bad_rewards.strings) returned "
        "'good' (str) for completion 0: a reward is a number, or None for a completion it does not score",
        "run",
        trains=True,
    ),
    C(
        "reward-scalar",
        f"{REWARD}=bad_rewards.scalar {GRPO1}",
        "reward function 'mine' (bad_rewards.scalar) returned "
        "a float (1.0), not a list of one reward per completion",
        "run",
        trains=True,
    ),
    C(
        "reward-inf",
        f"{REWARD}=bad_rewards.infinite {GRPO1}",
        "reward function 'mine' (bad_rewards.infinite) returned "
        "inf for completion 0: rewards must be finite (None or NaN: not scored)",
        "run",
        trains=True,
    ),
    T(
        "reward-wrong-signature",
        f"{REWARD}=bad_rewards.wrong_signature {GRPO1}",
        "data.reward_funcs.mine: bad_rewards.wrong_signature(text) cannot be called as GRPO calls a reward function, "
        "f(prompts=..., completions=..., completion_ids=..., **dataset columns) (it takes no 'prompts'); add those "
        "arguments, or **kwargs",
    ),
    T(
        "reward-positional-only",
        f"{REWARD}=bad_rewards.positional_only {GRPO1}",
        "bad_rewards.positional_only",
    ),
    C(
        "reward-needs-a-column",
        f"{REWARD}=bad_rewards.needs_a_column {GRPO1}",
        "reward function 'mine' "
        "(bad_rewards.needs_a_column) needs the column 'answer', which the data does not have (its columns: ",
        "run",
    ),
    # issue 36: a reward model (a class) and an environment's get_reward() go through the same checks
    T(
        "reward-class-partial",
        f"{REWARD}=ablate.rewards.RewardModel +data.reward_funcs.mine.path=x {GRPO1}",
        "data.reward_funcs.mine: ablate.rewards.RewardModel is a class: drop _partial_",
    ),
    T(
        "reward-class-not-callable",
        "train method=grpo +data.reward_funcs.mine._target_=bad_rewards.NotCallable",
        "data.reward_funcs.mine: bad_rewards.NotCallable is a class whose instances cannot be called",
    ),
    C(
        "environment-reward-a-word",
        f"train method=grpo data=calc_tools method.args.environment={{_target_:bad_rewards.WordyEnv}} "
        f"method.args.max_completion_length=8 {GRPO1}",
        "reward function 'WordyEnv' (bad_rewards.WordyEnv.get_reward) "
        "returned 'good' (str) for completion 0: a reward is a number",
        "run",
        trains=True,
    ),
    C(
        "reward-all-null",
        "train method=grpo data.reward_funcs.repeat_fraction=null",
        "data.reward_funcs: GRPO needs a reward function, and every entry is null",
    ),
    # issue 32's own catalogue (docs/errors.md): commands' own mistakes, user code, resources
    C(
        "cache-kind-typo",
        "cache clear --kind tokenised",
        "ablate cache: argument --kind: invalid choice: 'tokenised'",
    ),
    C("cache-no-action", "cache", "ablate cache: the following arguments are required: action"),
    C("ls-status-typo", "ls --status finished", "ablate ls: argument --status: invalid choice: 'finished'"),
    C("fetch-unknown", "fetch llama70b", "ablate fetch: no model 'llama70b' to fetch"),
    C(
        "sweep-resume-nothing",
        "sweep --resume",
        "which sweep? give its name (dpo_loss) or file, or --resume SWEEP_DIR",
    ),
    C(
        "sweep-dry-and-resume",
        "sweep dpo_loss --dry-run --resume",
        "--dry-run and --resume do not go together",
    ),
    C(
        "status-a-run-dir",
        f"status {OLD}",
        f"{OLD} is a run dir, not a sweep dir: `ablate ls {OLD}` shows its state",
    ),
    C(
        "grpo-data-without-rewards",
        "train method=grpo data=local data.train_path={F}/good.jsonl",
        "data.reward_funcs: GRPO needs a reward function, and data=local has none: add yours, data.reward_funcs="
        "[MODULE.FUNCTION] (MODULE.py in the directory you run ablate from), or use data that scores itself",
    ),
    C(
        "compare-out-a-file",
        "compare {F}/done_run --out notes.txt",
        "--out notes.txt is a file: give a directory",
        files=(("notes.txt", "mine\n"),),
    ),
    C(
        "compare-out-not-a-report",
        "compare {F}/done_run --out report",
        "--out report holds files that are not an ablate "
        "report (report.html): give a new or empty dir; nothing was written",
        files=(("report/report.html", "<p>mine</p>\n"),),
    ),
    C("threads-too-many", "train threads=100000", "threads=100000: this machine gives the run", "run"),
    C(
        "lora-rank-too-big",
        "train +peft=lora peft.r=1000000000",
        "peft.r=1000000000: larger than any layer it adapts (the widest is 64 wide): must be at most 64",
        "run",
    ),
    C(
        "user-callback-raises",
        "train +callbacks.boom._target_=bad_code.Boom method.args.max_steps=2",
        "your code raised KeyError: 'my callback broke' (",
        "run",
        trains=True,
    ),
    C(
        "user-loss-raises",
        "train method.dpo_loss._target_=bad_code.loss_raises method.args.max_steps=2",
        "your code raised ZeroDivisionError: my loss broke (",
        "run",
        trains=True,
    ),
    C(
        "user-loss-not-a-tensor",
        "train method.dpo_loss._target_=bad_code.loss_not_a_tensor method.args.max_steps=2",
        "method.dpo_loss (bad_code.loss_not_a_tensor) returned (float, dict): a DPO loss returns (losses, metrics)",
        "run",
        trains=True,
    ),
    C(
        "user-loader-raises",
        "train data._target_=bad_code.loader_raises",
        "your code raised OSError: my loader broke (",
        "run",
    ),
    # an lr torch cannot represent in its update (a 72-line traceback from inside AdamW), a run that collapsed
    C(
        "lr-overflows-adam",
        "train optimizer.optimizer.lr=1e38",
        "optimizer.optimizer.lr=1e+38: must be a number > 0 with "
        "lr / (1 - beta1) under float32's largest, 3.4e+38",
    ),
    C(
        "lr-overflows-sgd",
        "train optimizer=sgd optimizer.optimizer.lr=1e39",
        "optimizer.optimizer.lr=1e+39: must be a number > 0 under float32's largest",
    ),
    C(
        "dpo-collapses",
        "train optimizer.optimizer.lr=1e4 method.args.max_steps=30 method.args.logging_steps=1",
        "grad_norm is exactly 0 at steps 2-3",
        "run",
        trains=True,
    ),
    C(
        "sgd-collapses",
        "train optimizer=sgd optimizer.optimizer.lr=1e6 method.args.max_steps=30 method.args.logging_steps=1",
        "the model has collapsed (no gradient reaches it; too high an lr?); stopping (NaNGuard)",
        "run",
        trains=True,
    ),
    # ===== the fourth pass's catalogue: old checks answered loosely, new surfaces answered wrongly =====
    C(
        "group-then-bad-value",
        "train method/dpo_loss=robust method.dpo_loss.label_smoothing=2",
        "method.dpo_loss.label_smoothing=2: must be a number in [0, 0.5)",
    ),
    C(
        "run-dir-of-another-app",
        "train hydra.run.dir=theirs",
        "run dir theirs is not empty and holds no ablate run (run.json missing; found .hydra)",
        files=(("theirs/.hydra/config.yaml", "theirs: 1\n"),),
    ),
    C(
        "run-dir-another-apps-lock",
        "train hydra.run.dir=theirs",
        "holds no ablate run (run.json missing; found .lock)",
        files=(("theirs/.lock", "locked by my editor\n"),),
    ),
    C(
        "reward-exits",
        f"{REWARD}=bad_rewards.exits {GRPO1}",
        "reward function 'mine' (bad_rewards.exits) called "
        "sys.exit(0): a reward function returns its rewards",
        "run",
        trains=True,
    ),
    C(
        "reward-beyond-float32",
        f"{REWARD}=bad_rewards.beyond_float32 {GRPO1}",
        "reward function 'mine' "
        "(bad_rewards.beyond_float32) returned 1e+39 for completion 0: beyond float32's range (3.4e+38)",
        "run",
        trains=True,
    ),
    # every method's data file is checked against its kind (ablate.data.kinds) before torch, not only DPO/SFT/GRPO's
    C(
        "kto-no-label",
        "train method=kto data=jsonl data.train_path={F}/no_label.jsonl",
        "data.train_path={F}/no_label.jsonl: KTO found columns ['completion', 'prompt'], expected one of [unpaired "
        "preference: prompt, completion, label; preference: prompt, chosen, rejected; implicit-prompt preference: "
        "chosen, rejected]: missing 'label' (unpaired preference; rename with data.columns.<role>=<your column>)",
    ),
    C(
        "reward-no-pairs",
        "train method=reward data=jsonl data.train_path={F}/good_bad_margin.jsonl",
        "data.train_path={F}/good_bad_margin.jsonl: reward modelling found columns ['bad', 'good', 'margin', 'prompt'], "
        "expected one of [preference: prompt, chosen, rejected; implicit-prompt preference: chosen, rejected]: "
        "missing 'chosen', 'rejected' (preference;",
    ),
    C(
        "distill-no-prompt",
        "train method=distill +teacher=tiny data=jsonl data.train_path={F}/questions.jsonl",
        "data.train_path={F}/questions.jsonl: method=distill found columns ['question'], expected one of "
        "[prompt-only: prompt]: missing 'prompt' (prompt-only;",
    ),
    C(
        "data-kind-unknown",
        "train method.data_kind=pairs",
        "method.data_kind=pairs: no such kind of data; one of "
        "preference, sft, prompt, reward, unpaired (ablate.data.kinds), or null for data ablate does not check",
    ),
    C(
        "distill-own-data-scripted-teacher",
        "train method=distill data=local data.train_path={F}/prompts.jsonl",
        "method=distill with data=local needs a teacher: without +teacher the teacher is the scripted one of "
        "data=tiny_repeat's letter task",
    ),
    C(
        "distill-teacher-path-missing",
        "train method=distill +teacher=local teacher.path={F}/nope",
        "teacher.path={F}/nope is not a save_pretrained directory (not found)",
    ),
    C(
        "distill-teacher-path-relative",
        "train method=distill +teacher=local teacher.path=runs/x/model",
        "teacher.path=runs/x/model is not a save_pretrained directory (not found; read as a local path: it "
        "cannot be a hub id (NAME or ORG/NAME))",
    ),
    # a relative path that could be a hub id (ORG/NAME) but whose first folder is here: a local path
    C(
        "distill-teacher-path-under-outputs",
        "train method=distill +teacher=local teacher.path=outputs/model",
        "teacher.path=outputs/model is not a save_pretrained directory (not found; read as a local path: "
        "./outputs is a folder here)",
    ),
    C(
        "distill-teacher-a-classifier",
        "train method=distill +teacher=local teacher.path={F}/classifier",
        "teacher.path={F}/classifier holds a LlamaForSequenceClassification (a reward model), not a causal LM",
    ),
    T(
        "distill-teacher-other-ids",
        "train method=distill +teacher=local teacher.path={F}/other_ids",
        "teacher: its tokenizer has the student's 259 tokens under other ids (",
        phase="run",
    ),
    T(
        "environment-needs-arguments",
        "train method=grpo data=calc_tools method.args.environment={_target_:bad_rewards.EnvWithArgs}",
        "method.args.environment: bad_rewards.EnvWithArgs "
        "needs 'size', which TRL's environment_factory never passes (one instance per rollout, made with no "
        "arguments): set it in the config, method.args.environment.size=..., or give it a default",
    ),
    C(
        "reward-margin-text",
        "train method=reward data=jsonl data.train_path={F}/margin_text.jsonl",
        "data: train row 1: margin='big' is not a number (TRL's margin: how much the chosen must win by, a "
        "finite float)",
        "run",
    ),
    C(
        "reward-pairs-identical",
        "train method=reward data=jsonl data.train_path={F}/identical.jsonl",
        "every train pair's chosen is identical to its rejected",
        "run",
    ),
    T(
        "reward-model-config-junk",
        "train method=grpo +data.reward_funcs.rm._target_=ablate.rewards.RewardModel "
        "+data.reward_funcs.rm.path={F}/junk_model",
        "RewardModel: {F}/junk_model/config.json is not JSON (not UTF-8 text): a damaged or unfinished save",
    ),
    # a reward model's settings: its schema (ablate.schema.nodes.RewardModel), named or in a list
    C(
        "reward-model-batch-size",
        "train method=grpo +data.reward_funcs.rm._target_=ablate.rewards.RewardModel "
        "+data.reward_funcs.rm.path={F}/classifier +data.reward_funcs.rm.batch_size=0",
        "data.reward_funcs.rm.batch_size=0: must be an integer >= 1",
    ),
    C(
        "reward-model-dtype-in-list",
        "train method=grpo ~data.reward_funcs "
        "+data.reward_funcs=[{_target_:ablate.rewards.RewardModel,path:{F}/classifier,dtype:fp8}]",
        "data.reward_funcs[0].dtype=fp8: must be one of float32, bfloat16, float16",
    ),
    C(
        "distill-teacher-config-junk",
        "train method=distill +teacher=local teacher.path={F}/junk_model",
        "teacher.path={F}/junk_model: {F}/junk_model/config.json is not JSON (not UTF-8 text): a damaged or unfinished save",
    ),
    C(
        "reward-list-onto-named",
        "train method=grpo data.reward_funcs=[bad_rewards.length]",
        "data.reward_funcs=[bad_rewards.length]: data.reward_funcs is a mapping here (name -> function), which a list "
        "cannot be merged into: add yours, +data.reward_funcs.length=bad_rewards.length, or replace them all, "
        "'~data.reward_funcs' '+data.reward_funcs=[bad_rewards.length]'",
    ),
    T(
        "reward-not-partial",
        "train method=grpo +data.reward_funcs.mine._target_=bad_rewards.length",
        "data.reward_funcs.mine: add _partial_: true (data.reward_funcs.mine._partial_=true)",
    ),
]

# a diverging run (lr=1e6): one line from the guard, not a traceback from inside sampling or the optimizer
SLOW_CASES: list[Case] = [
    # the weights are NaN after step 2's update; the default logging_steps=10 would see it only at step 10
    C(
        "grpo-diverges-before-sampling",
        "train method=grpo optimizer.optimizer.lr=1e6 method.args.max_steps=20",
        "NaN/inf before the generation round",
        "run",
        trains=True,
    ),
    C(
        "dpo-diverges",
        "train optimizer=sgd optimizer.optimizer.lr=1e30 method.args.max_steps=3 method.args.logging_steps=1",
        "(NaNGuard)",
        "run",
        trains=True,
    ),
]


def _messages(*roles: str) -> list[dict[str, str]]:
    return [{"role": r, "content": f"{r} says hi"} for r in roles]


UNREADABLE = ("unreadable_run", "unsearchable", "unreadable.jsonl")  # chmod 000 while the table runs
READ_ONLY = ("ro_home",)  # chmod 555


def _fixtures(root: Path) -> Path:
    f = root / "fixtures"
    f.mkdir()
    lines = lambda rows: "".join(json.dumps(r) + "\n" for r in rows)  # noqa: E731
    (f / "mixed.jsonl").write_text(lines([ROWS[0], {"messages": _messages("user", "assistant")}]))
    (f / "robot.jsonl").write_text(lines([{"messages": _messages("user", "robot")}] * 4))
    (f / "human_gpt.jsonl").write_text(lines([{"messages": _messages("human", "gpt")}] * 4))
    (f / "empty_strings.jsonl").write_text(lines([{"prompt": "", "chosen": "", "rejected": ""}] * 4))
    (f / "huge_line.jsonl").write_text(lines([{"prompt": "x" * (3 << 19), "chosen": "a", "rejected": "b"}]))
    (f / "unreadable.jsonl").write_text(lines(ROWS))
    for name, info in (
        ("empty_run_json", {}),
        ("list_run_json", [1]),
        ("done_run", {"overrides": [], "started": "2026-01-01T00:00:00"}),
        ("unreadable_run", {"overrides": []}),
    ):
        (f / name).mkdir()
        (f / name / "run.json").write_text(json.dumps(info))
        (f / name / "summary.json").write_text(
            json.dumps(
                {
                    "status": "completed",
                    "method": "dpo",
                    "global_step": 4,
                    "metrics": {"rewards/accuracies": 1.0, "loss": 0.5},
                }
            )
        )
    (f / "unreadable_run" / "multirun.yaml").write_text("{}\n")
    (f / "unsearchable").mkdir()
    (f / "ro_home").mkdir()
    (f / "conf" / "experiment").mkdir(parents=True)
    (f / "conf" / "experiment" / "quoted_lr.yaml").write_text(
        '# @package _global_\noptimizer:\n  optimizer:\n    lr: "1e-3"\n'
    )
    (f / "conf" / "method").mkdir()
    (f / "conf" / "method" / "old_dpo.yaml").write_text(
        "defaults:\n  - dpo\n  - _self_\n\ntrainer:\n  _target_: ablate.trainers.dpo.DPOTrainer\n"
    )
    (f / "no_label.jsonl").write_text(
        lines([{"prompt": f"write {i}", "completion": "abc"} for i in range(8)])
    )
    (f / "good_bad_margin.jsonl").write_text(
        lines([{"prompt": r["prompt"], "good": "abc", "bad": "cba", "margin": 1.0} for r in ROWS])
    )
    (f / "questions.jsonl").write_text(lines([{"question": f"write {i}"} for i in range(8)]))
    (f / "prompts.jsonl").write_text(lines([{"prompt": f"write {i}"} for i in range(8)]))
    (f / "margin_text.jsonl").write_text(lines([{**ROWS[0], "margin": 1.0}, {**ROWS[1], "margin": "big"}]))
    (f / "identical.jsonl").write_text(
        lines([{"prompt": r["prompt"], "chosen": "abc", "rejected": "abc"} for r in ROWS])
    )
    (f / "classifier").mkdir()
    (f / "classifier" / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForSequenceClassification"], "num_labels": 1})
    )
    (f / "junk_model").mkdir()
    (f / "junk_model" / "config.json").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe not a config")
    _other_ids_teacher(f / "other_ids")
    _user_only_template(f / "user_only_template")
    (f / "good.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (f / "latin1.jsonl").write_bytes(
        json.dumps(ROWS[0]).encode() + b"\n" + '{"prompt": "caf\xe9"}\n'.encode("latin-1")
    )
    half = [json.dumps(r) for r in ROWS]
    half[6] = json.dumps({"prompt": "sort 6", "chosen": "abc"})
    (f / "half_pair.jsonl").write_text("\n".join(half) + "\n")
    half[6] = '{"prompt": "sort 6", "chosen": "abc", '
    (f / "bad_json_7.jsonl").write_text("\n".join(half) + "\n")
    (f / "bad_json.jsonl").write_text(json.dumps(ROWS[0]) + "\n{'prompt': 1}\n")
    (f / "array.jsonl").write_text("[1, 2]\n")
    (f / "empty.jsonl").write_text("\n\n")
    (f / "empty_dir").mkdir()
    (f / "a_file").write_text("not a dir\n")
    (f / "sweep").mkdir()
    (f / "sweep" / "malformed.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params: [1, 2\n"
    )
    (f / "sweep" / "latin1.yaml").write_bytes("# @package _global_\nsweep_name: caf\xe9\n".encode("latin-1"))
    return f


def _other_ids_teacher(path: Path) -> None:
    """The tiny model saved with a tokenizer of the same 259 tokens, the bytes' ids reversed: sizes that match,
    ids that do not (a teacher from another tokenizer of the same size)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from ablate.models import tiny
    from ablate.models.tokenizer import BOS, EOS, PAD

    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for ch in reversed(sorted(pre_tokenizers.ByteLevel.alphabet())):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS)
    tiny()[1].save_pretrained(path)
    fast.save_pretrained(path)


def _user_only_template(path: Path) -> None:
    """The tiny model saved with a chat template that renders the user's turns only (never an assistant's)."""
    from ablate.models import tiny

    tok, model = tiny()
    tok.chat_template = "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}\n{% endif %}{% endfor %}"
    model.save_pretrained(path)
    tok.save_pretrained(path)


def _old_run(cwd: Path) -> None:
    d = cwd / OLD
    (d / ".hydra").mkdir(parents=True)
    (d / "model").mkdir()
    (d / "run.json").write_text(json.dumps({"overrides": [], "started": "2026-01-01T00:00:00"}))
    (d / "summary.json").write_text(json.dumps({"status": "completed", "method": "dpo", "global_step": 60}))
    (d / "metrics.jsonl").write_text('{"step": 5, "time": 1.0, "loss": 0.6}\n')
    (d / ".hydra" / "overrides.yaml").write_text("[]\n")
    (d / "ablate.log").write_text("old log\n")
    (d / "model" / "model.safetensors").write_bytes(os.urandom(64))


def _snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every path under `root`: content hash (files) and mtime: touching anything changes it."""
    out = {}
    for p in sorted(root.rglob("*")):
        digest = hashlib.sha1(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[str(p.relative_to(root))] = (digest, p.stat().st_mtime_ns)
    return out


@dataclass
class Result:
    case: Case
    proc: subprocess.CompletedProcess
    cwd: Path
    before: dict[str, tuple[str, int]]  # the whole scratch cwd before the command
    torch: bool = False  # the command imported torch


def _run_all(cases: list[Case], tmp: Path, warm: bool = False) -> dict[str, Result]:
    """Every case from its own scratch cwd, through tests/fork_runner.py: one Python start-up for the
    whole table, then one fork per case (the same `ablate.cli.main` as `python -m ablate`). `warm`:
    the runner imports torch & co. once first (for cases that import them anyway)."""
    fixtures = _fixtures(tmp)
    jobs, before, held = [], {}, []
    fill = lambda text: text.replace("{F}", str(fixtures))  # noqa: E731
    for c in cases:
        cwd = tmp / c.id
        cwd.mkdir()
        _old_run(cwd)
        for name, text in c.files:
            (cwd / name).parent.mkdir(parents=True, exist_ok=True)
            (cwd / name).write_bytes(text) if isinstance(text, bytes) else (cwd / name).write_text(text)
        for name in c.locked:  # as a running launch holds it
            fd = os.open(cwd / name / ".lock", os.O_RDWR | os.O_CREAT)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, b"PID 4242 on host otherbox\n")
            held.append(fd)
        before[c.id] = _snapshot(cwd)
        jobs.append(
            {
                "argv": [fill(a) for a in c.argv],
                "cwd": str(cwd),
                "env": {k: fill(v) for k, v in c.env.items()},
                "unprivileged": c.unprivileged,
            }
        )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "WANDB_MODE": "offline",
        "ABLATE_FORK_WARM": "1" if warm else "0",
    }
    for name in UNREADABLE:
        (fixtures / name).chmod(0)
    for name in READ_ONLY:
        (fixtures / name).chmod(0o555)
    try:
        proc = subprocess.run(
            [sys.executable, str(TESTS / "fork_runner.py")],
            input=json.dumps(jobs),
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    finally:
        for name in UNREADABLE + READ_ONLY:
            (fixtures / name).chmod(0o755)
        for fd in held:
            os.close(fd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    return {
        c.id: Result(
            c,
            subprocess.CompletedProcess(c.argv, o["returncode"], o["stdout"], o["stderr"]),
            tmp / c.id,
            before[c.id],
            o["torch"],
        )
        for c, o in zip(cases, out)
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Result]:
    """The cases refused before torch (each ~1 s, from a runner without torch: the test that they
    never import it is real), then the others from a runner that imported it once (but a case with
    its own environment runs cold: huggingface_hub reads HF_HUB_OFFLINE and HF_ENDPOINT at import)."""
    cold = [
        c for c in CASES if (c.phase == "config" and not c.torch) or c.env
    ]  # env: read by libraries at import
    warm = [c for c in CASES if c not in cold]
    return {
        **_run_all(cold, tmp_path_factory.mktemp("bad")),
        **_run_all(warm, tmp_path_factory.mktemp("bad_warm"), warm=True),
    }


def _check(r: Result) -> None:
    case, proc = r.case, r.proc
    fixtures = str(r.cwd.parent / "fixtures")
    says = case.says.replace("{F}", fixtures)
    err = proc.stderr
    assert proc.returncode == 2, f"exit {proc.returncode}\n{err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    errors = re.findall(r"ablate: error: [^\r\n]*", err)  # a progress bar may share its line (\r)
    assert len(errors) == 1, err[-3000:]
    assert says in errors[0], errors[0]
    # what a terminal shows: a progress bar redrawn with \r is one line; at most it and the error
    # (a run stopped while training: its progress bar's lines, then the error on a line of its own)
    assert case.trains or len([line for line in err.splitlines() if line.strip()]) <= 2, err[-3000:]
    if case.phase == "config":
        # the whole of stderr is that one line, and nothing was created or changed anywhere in the cwd
        assert err.strip() == errors[0], err[-3000:]
        assert _snapshot(r.cwd) == r.before, "files were created or changed"
        assert case.torch or not r.torch, "refused only after importing torch (seconds): check it earlier"
    else:
        assert err.rstrip().splitlines()[-1] == errors[0], err[
            -3000:
        ]  # the last thing said, on a line of its own
        new = [p.parent for p in (r.cwd / "outputs").rglob("run.json") if OLD not in str(p)]
        if case.argv[0] == "train":  # the run dir records the failure in the same words
            assert len(new) == 1, new
            summary = json.loads((new[0] / "summary.json").read_text())
            assert (
                summary["status"] == "failed" and errors[0][len("ablate: error: ") :] in summary["error"]
            ), summary
            assert not (new[0] / "model").exists()
    assert _snapshot(r.cwd / "outputs" / "runs" / "2026-01-01") == {
        k[len("outputs/runs/2026-01-01/") :]: v
        for k, v in r.before.items()
        if k.startswith("outputs/runs/2026-01-01/")
    }, "the existing run dir was touched"


def test_table_is_big_enough():
    assert len(CASES) + len(SLOW_CASES) >= 160
    assert len({c.id for c in CASES + SLOW_CASES}) == len(CASES) + len(SLOW_CASES)


def test_most_cases_fail_before_torch(results):
    """The table's speed (and a user's): nearly every mistake is refused in about a second."""
    fast = [c for c in CASES if c.phase == "config" and not c.torch]
    assert len(fast) >= 0.8 * len(CASES)
    assert not [c.id for c in fast if results[c.id].torch]


def test_a_reward_functions_traceback_is_in_the_runs_log(results):
    """The one line names the log that holds the user's traceback (issue 32)."""
    line = re.findall(r"ablate: error: [^\r\n]*", results["reward-raises"].proc.stderr)[0]
    log = Path(line.split("(traceback: ", 1)[1].rstrip(")")).read_text()
    assert 'raise ValueError("my reward broke on purpose")' in log and "bad_rewards.py" in log, log[-3000:]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input(results, case):
    _check(results[case.id])


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW_CASES, ids=lambda c: c.id)
def test_bad_input_slow(tmp_path, case):
    _check(_run_all([case], tmp_path)[case.id])


def test_ls_lists_an_unreadable_run_dir_and_goes_on(tmp_path):
    """One run dir under outputs/ that cannot be read: `ablate ls` lists it as `unreadable` (and
    every other run as before), exit 0, where it used to crash with a traceback."""
    _old_run(tmp_path)
    bad = tmp_path / "outputs" / "runs" / "2026-01-02" / "00-00-00"
    bad.mkdir(parents=True)
    (bad / "run.json").write_text(json.dumps({"overrides": ["seed=1"]}))
    bad.chmod(0)
    try:
        out = subprocess.run(
            [sys.executable, str(TESTS / "fork_runner.py")],
            capture_output=True,
            text=True,
            input=json.dumps(
                [
                    {"argv": ["ls"], "cwd": str(tmp_path), "unprivileged": True},
                    {"argv": ["ls", "--json"], "cwd": str(tmp_path), "unprivileged": True},
                ]
            ),
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])},
        )
    finally:
        bad.chmod(0o755)
    assert out.returncode == 0, out.stderr[-3000:]
    text, js = json.loads(out.stdout)
    assert text["returncode"] == 0 and "Traceback" not in text["stderr"], text["stderr"][-3000:]
    rows = {r["path"].split("outputs/")[-1]: r for r in json.loads(js["stdout"])}
    assert rows["runs/2026-01-02/00-00-00"]["status"] == "unreadable"
    assert "permission denied" in rows["runs/2026-01-02/00-00-00"]["error"]
    assert rows["runs/2026-01-01/00-00-00"]["status"] == "completed"
    assert "2 run(s) under" in text["stdout"]


def test_version_is_one_line():
    r = ablate("--version")
    assert (
        r.returncode == 0
        and r.stdout.strip().startswith("ablate ")
        and len(r.stdout.strip().splitlines()) == 1
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only dirs")
def test_read_only_run_dir(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = ablate("train", f"hydra.run.dir={ro}/run", cwd=tmp_path)
    finally:
        ro.chmod(0o755)
    assert r.returncode == 2 and r.stderr.strip().startswith("ablate: error: ") and "not writable" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    shutil.rmtree(ro)


def _one_line(r: subprocess.CompletedProcess) -> str:
    """The run's one error line: exit 2, no traceback, the last thing on stderr."""
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = re.findall(r"ablate: error: [^\r\n]*", r.stderr)
    assert len(errors) == 1 and r.stderr.rstrip().splitlines()[-1] == errors[0], r.stderr[-3000:]
    return errors[0]


def test_a_file_size_limit_while_saving_is_one_line_and_the_last_checkpoint_stays(tmp_path):
    """`ulimit -f` (RLIMIT_FSIZE) passed while checkpoint-4 is written (the limit is lowered after checkpoint-2,
    as a model outgrowing it would): one line naming the limit and the resume; checkpoint-2 stays sealed and
    whole, the unfinished checkpoint-4 is removed, the run is recorded as failed with that line."""
    from ablate.record.checkpoints import checkpoint_problem

    r = ablate(
        "train",
        "+callbacks.fs._target_=bad_code.FileSizeLimitAfterFirstSave",
        "method.args.max_steps=4",
        "method.args.save_steps=2",
        "hydra.run.dir=run",
        cwd=tmp_path,
    )
    line = _one_line(r)
    assert "file-size limit: a file passed this process's limit of 65536 bytes per file (ulimit -f)" in line
    assert f"raise it (ulimit -f unlimited), then resume: ablate resume {tmp_path / 'run'}" in line
    ckpts = tmp_path / "run" / "checkpoints"
    assert (
        sorted(p.name for p in ckpts.iterdir()) == ["checkpoint-2"]
        and checkpoint_problem(ckpts / "checkpoint-2") is None
    )
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and line[len("ablate: error: ") :] in summary["error"]


def test_a_run_dir_deleted_while_training_is_one_line_and_not_made_again(tmp_path):
    """The run dir removed at step 2 (before checkpoint-2 is saved): one line saying so, exit 2, and the dir is
    not created again (by the summary, the log or the next save)."""
    r = ablate(
        "train",
        "+callbacks.rm._target_=bad_code.DeleteRunDirAt",
        "method.args.max_steps=4",
        "method.args.save_steps=2",
        "hydra.run.dir=run",
        cwd=tmp_path,
        env={"ABLATE_TEST_DELETE_AT": "2"},
    )
    line = _one_line(r)
    assert (
        f"the run dir {tmp_path / 'run'} was deleted (or moved) while training: nothing more can be saved"
        in line
    )
    assert not (tmp_path / "run").exists()


def test_kto_data_of_one_label_is_said(tmp_path):
    """Every example desirable: it trains (as in TRL), and says once that there is nothing to contrast them with."""
    rows = [{"prompt": f"sort {i}", "completion": "abc", "label": True} for i in range(8)]
    (tmp_path / "kto.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    r = ablate(
        "train",
        "method=kto",
        "data=jsonl",
        "data.train_path=kto.jsonl",
        "method.args.max_steps=1",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    said = [ln for ln in (r.stdout + r.stderr).splitlines() if "every train example (8) is desirable" in ln]
    assert len(said) == 1 and "KTO has no undesirable (label false) example to contrast them with" in said[0]


def test_rewards_near_float32s_largest_train_with_finite_numbers(tmp_path):
    """A reward function returning +-3e38 (finite; their float32 mean, spread and std overflow): the run trains on
    real advantages (a gradient reaches the model) and every logged number is finite, where it logged NaN and
    every advantage was 0."""
    import math

    r = ablate(
        *f"{REWARD}=bad_rewards.huge {GRPO1}".split(),
        "method.args.logging_steps=1",
        "hydra.run.dir=run",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    events = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    numbers = {k: v for e in events for k, v in e.items() if isinstance(v, float)}
    assert numbers and all(math.isfinite(v) for v in numbers.values()), numbers
    assert events[0]["grad_norm"] > 0 and events[0]["rewards/mine/std"] > 1e38


@pytest.mark.parametrize(
    "argv,hidden,extra",
    [
        (["train", "logger=wandb"], "wandb", "wandb"),
        (["train", "optimizer=adamw_8bit"], "bitsandbytes", "quant"),
        (["train", "+ref_model=live_4bit"], "bitsandbytes", "quant"),
        (["compare", ".", "--out", "report"], "matplotlib", "plot"),
        (["train", "method=grpo", "method/rollouts=vllm"], "vllm", "vllm"),
    ],
    ids=["wandb", "adamw_8bit", "live_4bit", "plots", "vllm"],
)
def test_missing_extra_is_one_line_naming_the_install(tmp_path, argv, hidden, extra):
    """An optional package that is not installed: one line with the pip command, nothing created."""
    r = ablate(*argv, cwd=tmp_path, env=hiding(tmp_path, hidden))
    assert r.returncode == 2, r.stderr[-3000:]
    assert (
        r.stderr.strip().splitlines() == [r.stderr.strip()] and f"pip install 'ablate[{extra}]'" in r.stderr
    )
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "report").exists()


def test_missing_slurm_launcher_names_the_extra():
    """Hydra finds its launcher plugins itself (not through imports a test can hide), so this one is
    checked on the error Hydra raises when the plugin's config is missing."""
    from hydra.errors import MissingConfigException

    from ablate.config.hints import one_line

    e = MissingConfigException(
        "Could not find 'hydra/launcher/submitit_slurm'", "hydra/launcher/submitit_slurm"
    )
    assert one_line(e) == (
        "hydra/launcher=slurm needs the optional package 'hydra_submitit_launcher', "
        "not installed: pip install 'ablate[slurm]'"
    )


def test_sweep_jobs_with_a_bad_value_fail_with_their_reason(tmp_path):
    """When a group is swept the jobs' configs are checked as each starts: every job fails fast
    (nothing built), records why in its summary.json, the table shows it, and the exit status is 1."""
    r = ablate("train", "-m", "method=dpo,dpo_hinge", "method.args.beta=0", cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == "ablate: 2 sweep job(s) failed (see the table above)"
    summaries = [json.loads(p.read_text()) for p in (tmp_path / "outputs" / "sweeps").rglob("summary.json")]
    assert len(summaries) == 2 and all(
        s["status"] == "failed" and "method.args.beta=0" in s["error"] for s in summaries
    )
    assert not list((tmp_path / "outputs").rglob("model"))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dpo", "grpo"])
def test_ctrl_c_while_training_is_one_line(tmp_path, method):
    """Ctrl-C (SIGINT) once training has started: exit 130, one line, the run recorded as stopped
    (not `running`), the older run dir untouched."""
    import signal
    import time

    _old_run(tmp_path)
    before = _snapshot(tmp_path / "outputs")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    # as from a terminal: SIGINT at its default, whatever pytest inherited (a shell's background job, e.g.
    # `nohup ... &`, starts with SIGINT ignored, and Python then keeps ignoring it, as it should)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ablate",
            "train",
            f"method={method}",
            "method.args.max_steps=100000",
            "method.args.logging_steps=1",
            "method.args.disable_tqdm=true",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )

    def new_metrics() -> list[Path]:
        return [
            p for p in (tmp_path / "outputs" / "runs").glob("2*/*/metrics.jsonl") if not str(p).count(OLD)
        ]

    deadline = time.time() + 300
    while not new_metrics() and time.time() < deadline:  # training has logged its first step
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("ablate: interrupted"), err[
        -3000:
    ]
    run_dir = new_metrics()[0].parent
    assert json.loads((run_dir / "summary.json").read_text())["status"] != "running"

    def old(snap: dict[str, tuple[str, int]]) -> dict[str, tuple[str, int]]:
        return {k: v for k, v in snap.items() if k.startswith("runs/2026-01-01")}

    assert old(_snapshot(tmp_path / "outputs")) == old(before)


def test_orpo_on_pairs_whose_chosen_is_their_rejected_says_so(tmp_path):
    """ORPO (as DPO, CPO, SimPO) on pairs whose two answers are the same tokens: the preference term learns
    nothing from them; said once, as reward modelling says it (which refuses a set of only such pairs), and
    the run goes on (ORPO's NLL term still trains). Pairs that differ: not a word."""
    data = tmp_path / "same.jsonl"
    data.write_text("".join(json.dumps({**r, "rejected": r["chosen"]}) + "\n" for r in ROWS))
    args = ["method.args.max_steps=1", "method.args.save_strategy=no", "cache=off"]
    r = ablate("train", "method=orpo", "data=jsonl", f"data.train_path={data}", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    said = [line for line in (r.stdout + r.stderr).splitlines() if "identical to their rejected" in line]
    assert len(said) == 1 and "8 of 8 train pairs" in said[0] and "teach no preference" in said[0], r.stdout
    r = ablate(
        "train",
        "method=orpo",
        "data=jsonl",
        f"data.train_path={TESTS}/../src/ablate/data/tiny/sort_prefs_eval.jsonl",
        *args,
        cwd=tmp_path,
    )
    assert r.returncode == 0 and "identical to their rejected" not in r.stdout + r.stderr, r.stderr[-3000:]
