"""The run directory contract, shared by training, resume, `ablate compare` and W&B.

    <run_dir>/
      .hydra/            Hydra's composed config, hydra config and overrides
      run.json           identity of the run: overrides, start time, versions, git sha, W&B run id
      metrics.jsonl      one JSON object per log event: {"step", "time", <metric names>...}
      summary.json       written at the end (also on failure): status, error, metrics, global_step, ...
      checkpoints/       Trainer checkpoints (checkpoint-<step>/), for resume
      model/             final model + tokenizer (safetensors), loadable with from_pretrained
      wandb/             offline W&B files when logger=wandb

This module imports neither torch nor transformers: `ablate compare` uses it on a laptop.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

SUMMARY, RUN, METRICS, CHECKPOINTS, MODEL = "summary.json", "run.json", "metrics.jsonl", "checkpoints", "model"


def is_main_process() -> bool:
    """Rank 0, or not distributed. torchrun and SLURM (via submitit's export) set RANK before any
    torch.distributed init, so this works before the trainer exists."""
    return int(os.environ.get("RANK", "0")) == 0


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically (tmp file + rename) so a reader never sees half a file. Only the main
    process writes: one run dir per job, not per rank."""
    if not is_main_process():
        return
    from ablate.redact import mask

    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(mask(data), indent=2, default=str) + "\n")  # secrets: ablate.redact
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All log events of a run; a half-written last line (run still going) is skipped."""
    out = []
    path = run_dir / METRICS
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("ablate", "torch", "transformers", "datasets", "accelerate", "hydra-core"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def git_sha() -> str | None:
    """The sha of the ablate checkout, when it is one (with `-dirty` if it has local changes)."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=5)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest *complete* checkpoint: Trainer writes trainer_state.json last, so a checkpoint
    interrupted mid-save (killed, preempted) has none and is skipped."""
    ckpts = []
    for p in (run_dir / CHECKPOINTS).glob("checkpoint-*"):
        m = re.fullmatch(r"checkpoint-(\d+)", p.name)
        if m and (p / "trainer_state.json").is_file():
            ckpts.append((int(m.group(1)), p))
    return max(ckpts)[1] if ckpts else None


def truncate_metrics(run_dir: Path, after_step: int) -> None:
    """On resume, drop log events past the checkpoint: those steps run again and log again."""
    path = run_dir / METRICS
    if path.is_file() and is_main_process():
        keep = [json.dumps(e) for e in read_metrics(run_dir) if e.get("step", 0) <= after_step]
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(k + "\n" for k in keep))
        os.replace(tmp, path)
