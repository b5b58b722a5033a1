"""A user's own reward function on their own JSONL, from the documented one-liner (issue 36): the `ablate`
console script (the cwd is not on its import path), run from the directory holding `myrew.py` and the data,
no PYTHONPATH; the function is found, called and logged under its name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, metrics, summary

SCRIPT = Path(sys.executable).parent / "ablate"


@pytest.mark.skipif(
    not SCRIPT.is_file(), reason="the ablate console script is not installed in this environment"
)
def test_own_reward_function_on_own_jsonl(tmp_path):
    shutil.copy(ROOT / "examples/grpo_own_code/myrew.py", tmp_path / "myrew.py")  # docs/methods.md's
    rows = (ROOT / "src/ablate/data/tiny/repeat_letter_train.jsonl").read_text().splitlines()[:16]
    (tmp_path / "my_prompts.jsonl").write_text(
        "\n".join(json.dumps({"prompt": json.loads(r)["prompt"]}) for r in rows)
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(
        [
            str(SCRIPT),
            "train",
            "method=grpo",
            "data=local",
            "data.train_path=my_prompts.jsonl",
            "data.reward_funcs=[myrew.short]",
            "method.args.max_steps=2",
            "method.args.max_completion_length=8",  # the data says none: GRPOArgs' 256 otherwise
            "method.args.logging_steps=1",
            "hydra.run.dir=run",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert summary(tmp_path / "run")["status"] == "completed"
    logged = [e["rewards/short/mean"] for e in metrics(tmp_path / "run") if "rewards/short/mean" in e]
    assert len(logged) == 2 and all(-1.0 <= v < 0 for v in logged), (
        logged
    )  # 8 new tokens at most: -1 <= reward
