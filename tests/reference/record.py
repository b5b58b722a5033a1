"""Record the reference loss curves (tests/reference/curves.json): one short tiny-model CPU run per
method. Rerun only on purpose (a deliberate numerical change, or new torch/transformers versions):

    python tests/reference/record.py              (every method)
    python tests/reference/record.py rloo distill (only these: a new method; the others' values kept)

tests/integration/test_reference_curves.py replays each run and compares the per-step losses.
"""

from __future__ import annotations

import json
import sys
import tempfile
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from conftest import ablate, metrics  # noqa: E402

# per method: the overrides of its reference run (short, logged every step)
RUNS = {
    "dpo": ["method=dpo", "method.args.max_steps=20"],
    "dpo_hinge": ["method=dpo_hinge", "method.args.max_steps=20"],
    "sft": ["method=sft", "method.args.max_steps=20"],
    "grpo": ["method=grpo", "method.args.max_steps=12", "method.args.steps_per_generation=2"],
    "reward": ["method=reward", "method.args.max_steps=20"],
    "kto": ["method=kto", "method.args.max_steps=20"],
    "rloo": ["method=rloo", "method.args.max_steps=12", "method.args.steps_per_generation=2"],
    "distill": ["method=distill", "method.args.max_steps=12"],
}
COMMON = ["method.args.logging_steps=1", "method.args.save_strategy=no"]
# GRPO's and RLOO's loss is ~0 by design (advantages centred): their reward is the curve
KEYS = {"dpo": "loss", "dpo_hinge": "loss", "sft": "loss", "grpo": "reward", "reward": "loss", "kto": "loss",
        "rloo": "reward", "distill": "loss"}


def versions() -> dict[str, str]:
    return {p: metadata.version(p) for p in ("torch", "transformers")}


def curve(method: str) -> list[float]:
    """Per-step values of the method's key metric in a fresh run of its reference overrides."""
    with tempfile.TemporaryDirectory() as tmp:
        r = ablate("train", *RUNS[method], *COMMON, f"hydra.run.dir={tmp}/run", env={"OMP_NUM_THREADS": "1"})
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        return [e[KEYS[method]] for e in metrics(Path(tmp) / "run") if KEYS[method] in e and "train_loss" not in e]  # not the end-of-train summary event


def main(only: list[str] | None = None) -> None:
    """Record every method's curve, or (`python tests/reference/record.py NAME ...`) only the named methods'
    (a new method), keeping the others' recorded values."""
    old = json.loads((HERE / "curves.json").read_text()) if only else {"runs": {}}
    if only and old["versions"] != versions():
        raise SystemExit(f"curves.json was recorded with {old['versions']}, this is {versions()}: record every method")
    out = {"versions": versions(), "common": COMMON,
           "runs": {m: {"overrides": RUNS[m], "metric": KEYS[m], "values": curve(m)} if not only or m in only
                    else old["runs"][m] for m in RUNS}}
    (HERE / "curves.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {HERE / 'curves.json'} with {out['versions']}")


if __name__ == "__main__":
    main(sys.argv[1:] or None)
