"""`eval=lm_eval`: EleutherAI's lm-evaluation-harness (`pip install 'ablate[eval]'`) on the run's model.

lm-eval runs the tasks itself: `lm_eval.simple_evaluate` over its `HFLM` wrapping the run's model and
tokenizer as loaded (adapters included), with `num_fewshot`, `limit` and `batch_size` as given, and the
tokenizer's chat template applied as lm-eval applies it (`apply_chat_template`) when the run trained on
chat-formatted rows (run.json's `data_format`) or `chat_template=true`. Every task metric lands in eval.json
as `lm_eval/<task>/<metric>` with its `..._stderr` (a filter other than lm-eval's `none`, e.g. gsm8k's
`strict-match`, is appended: `lm_eval/gsm8k/exact_match/strict-match`), and each example's scores, under the
same names, in eval_examples.jsonl with the id `lm_eval/<task>/<hash of the document>`, so `ablate compare`
pairs examples across runs.

ablate ships lm-eval task YAMLs of its tiny tasks (tasks/: `ablate_sort`, generate_until with exact match;
`ablate_sort_choice`, multiple choice) over its local JSONL files (`dataset_path: json`), which run with no
hub access; any other name is one of lm-eval's own tasks (gsm8k, ifeval, mmlu, ...), whose data comes from
the Hugging Face hub. An unknown task, lm-eval missing, or a hub task while the hub cannot be reached and its
data is not cached are refused in one line before training (`check`).
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from ablate.errors import ConfigError, missing_extra
from ablate.evaluation.base import Evaluand, Result
from ablate.schema.evaluation import LmEvalEval as E

TASKS_DIR = Path(__file__).parent / "tasks"
PREFIX = "lm_eval/"
LOCAL_BUILDERS = {"json", "csv", "parquet", "text", "arrow"}  # datasets' builders of local files
OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def shipped() -> dict[str, Path]:
    """ablate's own tasks: {name: its YAML}."""
    return {p.stem: p for p in sorted(TASKS_DIR.glob("*.yaml"))}


def shipped_config(name: str) -> dict[str, Any]:
    """One of ablate's task YAMLs as the config dict lm-eval takes, its data files made absolute (they are
    written relative to the YAML, which lm-eval would read relative to the working directory)."""
    import yaml

    path = shipped()[name]
    config = yaml.safe_load(path.read_text())
    files = config["dataset_kwargs"]["data_files"]
    config["dataset_kwargs"]["data_files"] = {k: str((path.parent / v).resolve()) for k, v in files.items()}
    return config


@cache
def _library_tasks() -> Any:
    """lm-eval's own task index (it reads every task YAML it ships: seconds; only for a task not ablate's)."""
    from lm_eval.tasks import TaskManager

    return TaskManager()


class LmEval:
    """lm-eval's tasks on the run's model; see the module docstring."""

    name = "lm_eval"

    def __init__(
        self,
        tasks: list[str],
        num_fewshot: int | None = E.num_fewshot,
        limit: int | None = E.limit,
        batch_size: int = E.batch_size,
        chat_template: bool | None = E.chat_template,
    ) -> None:
        self.tasks = [str(t) for t in tasks]
        self.num_fewshot, self.limit, self.batch_size, self.chat_template = (
            num_fewshot,
            limit,
            batch_size,
            chat_template,
        )

    def check(self, cfg: Any = None) -> None:
        """lm-eval installed, every task known, and a hub task's data reachable or cached."""
        import importlib.util

        if importlib.util.find_spec("lm_eval") is None:
            raise missing_extra("lm_eval", "eval", "eval=lm_eval (lm-evaluation-harness)")
        ours = shipped()
        others = [t for t in self.tasks if t not in ours]
        if not others:
            return
        index = _library_tasks().task_index
        for task in others:
            if task not in index:
                hint = difflib.get_close_matches(task, [*ours, *index], n=1)
                meant = f"did you mean {hint[0]}? " if hint else ""
                raise ConfigError(
                    f"eval.lm_eval.tasks: no lm-eval task '{task}' ({meant}ablate's: {', '.join(ours)}; "
                    "lm-eval's: `lm_eval ls tasks`)"
                )
            _check_hub(task, getattr(index[task], "cfg", None) or {})

    def __call__(self, run: Evaluand) -> Result:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager

        self.check()
        ours = shipped()
        tasks = [shipped_config(t) if t in ours else t for t in self.tasks]
        manager = (
            TaskManager(include_defaults=False) if all(t in ours for t in self.tasks) else _library_tasks()
        )
        chat = self.chat_template
        if chat is None:  # as the run trained: its rows went through the chat template or not
            chat = bool((run.info.get("data_format") or {}).get("conversational"))
        logging.getLogger("lm_eval").setLevel(logging.ERROR)  # its notes on a model passed in, not a name
        with quiet():
            lm = HFLM(pretrained=run.model, tokenizer=run.tokenizer, batch_size=self.batch_size)
            out = lm_eval.simple_evaluate(
                model=lm,
                tasks=tasks,
                num_fewshot=self.num_fewshot,
                limit=self.limit,
                log_samples=True,
                apply_chat_template=chat,
                task_manager=manager,
                random_seed=int(run.cfg.seed),
                verbosity="ERROR",
            )
        metrics, examples = results(out)
        facts = {
            "tasks": self.tasks,
            "num_fewshot": self.num_fewshot,
            "limit": self.limit,
            "chat_template": chat,
            "versions": {t: v for t, v in (out.get("versions") or {}).items()},
            "lm_eval": lm_eval.__version__ if hasattr(lm_eval, "__version__") else None,
        }
        return Result(metrics, examples, facts)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """lm-eval's progress bars and what its environment probes print (git's "not a git repository" outside a
    repo) kept off the console, at the file-descriptor level (subprocesses write there); shown after all when
    it fails."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile("w+") as caught:
        os.dup2(caught.fileno(), 1)
        os.dup2(caught.fileno(), 2)
        try:
            yield
        except BaseException:
            _restore(saved)
            caught.seek(0)
            sys.stderr.write(caught.read()[-4000:])
            raise
        finally:
            _restore(saved)


def _restore(saved: list[int]) -> None:
    if saved:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        saved.clear()


def _check_hub(task: str, config: dict[str, Any]) -> None:
    """A task whose data is on the hub, while the hub cannot be reached and it is not cached: one line."""
    source = str(config.get("dataset_path") or "")
    if not source or source in LOCAL_BUILDERS or Path(source).expanduser().exists():
        return
    from ablate.paths import hub_unreachable

    offline = next(
        (f"{v}=1" for v in OFFLINE_ENV if os.environ.get(v, "").lower() in ("1", "true", "yes", "on")), None
    )
    why = offline or hub_unreachable()
    if why is None or _cached(source):
        return
    raise ConfigError(
        f"eval.lm_eval.tasks: {task} reads its data ({source}) from the Hugging Face hub, which cannot be "
        f"reached here ({why}), and no copy is cached; run it where the hub can be reached, or pick ablate's "
        f"local tasks ({', '.join(shipped())})"
    )


def _cached(repo: str) -> bool:
    """Whether the hub cache holds the dataset repo `repo` (any file of it)."""
    from huggingface_hub import scan_cache_dir

    try:
        return any(r.repo_id == repo and r.repo_type == "dataset" for r in scan_cache_dir().repos)
    except Exception:  # no cache dir at all
        return False


def _name(task: str, key: str) -> str:
    """lm-eval's `exact_match,none` of task t -> `lm_eval/t/exact_match`; another filter is appended."""
    metric, _, kept = key.partition(",")
    stderr = metric.endswith("_stderr")
    base = metric.removesuffix("_stderr")
    return (
        f"{PREFIX}{task}/{base}"
        + ("_stderr" if stderr else "")
        + (f"/{kept}" if kept and kept != "none" else "")
    )


def results(out: dict[str, Any]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """simple_evaluate's output as eval.json's metrics (numbers only: lm-eval writes `N/A` for a stderr it
    cannot compute) and eval_examples.jsonl's rows (one per task and document)."""
    metrics: dict[str, float] = {}
    for task, found in (out.get("results") or {}).items():
        for key, value in found.items():
            if "," in key and isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[_name(task, key)] = float(value)
    rows = []
    for task, samples in (out.get("samples") or {}).items():
        for s in samples:
            doc = s.get("doc_hash") or hashlib.sha256(repr(s.get("doc")).encode()).hexdigest()
            scores = {
                _name(task, f"{m},{s.get('filter', 'none')}"): float(s[m])
                for m in s.get("metrics", [])
                if isinstance(s.get(m), (int, float))
            }
            response = s.get("filtered_resps") or s.get("resps")
            rows.append(
                {
                    "id": f"{PREFIX}{task}/{doc[:16]}",
                    **scores,
                    "prompt": str((s.get("arguments") or [[""]])[0][0])[:2000] if s.get("arguments") else "",
                    "response": str(response)[:2000],
                    "target": str(s.get("target"))[:2000],
                }
            )
    return metrics, rows
