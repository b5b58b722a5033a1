"""Secrets given as overrides (issue 12 item 4) reach no byte of the run dir (W&B's offline files
included), no dir name, no echoed command: masked as ***, `${oc.env:...}` kept as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ablate

LITERAL = "hf_LiteralTokenAbcdefghijklmnopqrstuv99"  # an HF token typed on the command line
OPENAI = "sk-proj-AbCdEfGhIjKlMnOpQrStUv0123"  # credential-shaped, under a harmless key
ENV_TOKEN = "hf_EnvTokenAbcdefghijklmnopqrstuvwxyz12"  # HF_TOKEN's value, referenced as ${oc.env:HF_TOKEN}
PASSWORD = "Pw-Zq8Xy7Wv6Ut5"  # MY_SERVICE_PASSWORD's value, under a harmless key
WANDB_KEY = "0123456789abcdef0123456789abcdef01234567"  # given to W&B through Hydra's env_set
SECRETS = (LITERAL, OPENAI, ENV_TOKEN, PASSWORD, WANDB_KEY)
ENV = {"HF_TOKEN": ENV_TOKEN, "MY_SERVICE_PASSWORD": PASSWORD, "WANDB_MODE": "offline"}


def _leaks(root: Path, *texts: str) -> list[str]:
    """(secret, where) for every path name, file byte and text that holds one."""
    found = []
    for p in root.rglob("*"):
        data = p.read_bytes() if p.is_file() else b""
        found += [f"{s} in {p}" for s in SECRETS if s in str(p.relative_to(root)) or s.encode() in data]
    found += [f"{s} in output" for t in texts for s in SECRETS if s in t]
    return found


def test_no_secret_in_any_byte_of_the_run_dir(tmp_path):
    r = ablate(
        "train",
        "logger=wandb",
        "method.args.max_steps=2",
        "method.args.save_steps=1",
        "+method.args.hub_token=${oc.env:HF_TOKEN}",
        f"+method.args.hub_model_id={OPENAI}",
        f"+method.args.run_name={PASSWORD}",
        f"logger.tags=[{LITERAL}]",
        f"+hydra.job.env_set.WANDB_API_KEY={WANDB_KEY}",
        cwd=tmp_path,
        env=ENV,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = next((tmp_path / "outputs" / "runs").glob("*/*"))
    files = {p.name for p in run_dir.rglob("*")}
    assert {
        "run.json",
        "summary.json",
        "config.yaml",
        "hydra.yaml",
        "overrides.yaml",
        "ablate.log",
        "training_args.bin",
    } <= files and any(n.endswith(".wandb") for n in files), files
    assert _leaks(tmp_path, r.stdout, r.stderr) == []
    # the env reference is recorded as written (a resume reads the variable again), never resolved
    assert (
        "+method.args.hub_token=${oc.env:HF_TOKEN}"
        in json.loads((run_dir / "run.json").read_text())["overrides"]
    )
    assert "hub_token: ${oc.env:HF_TOKEN}" in (run_dir / ".hydra" / "config.yaml").read_text()
    assert "***" in (run_dir / ".hydra" / "hydra.yaml").read_text()  # env_set's WANDB_API_KEY, masked


def test_echoed_sweep_command_and_error_line_are_masked(tmp_path):
    r = ablate(
        "sweep",
        "dpo_loss",
        f"+method.args.hub_token={LITERAL}",
        f"method.args.logging_steps={PASSWORD}",
        cwd=tmp_path,
        env=ENV,
    )
    assert r.returncode == 2 and r.stdout.startswith("ablate train ") and "hub_token=***" in r.stdout
    assert r.stderr.strip() == "ablate: error: method.args.logging_steps=***: must be a number > 0"
    assert _leaks(tmp_path, r.stdout, r.stderr) == []


def test_resume_asks_for_a_masked_secret_again(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"overrides": ["+method.args.hub_token=***", "seed=1"]}))
    (run_dir / "summary.json").write_text(json.dumps({"status": "failed"}))
    r = ablate("resume", str(run_dir), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "give it again" in r.stderr and "+method.args.hub_token=..." in r.stderr


QUOTED = "Tr0ub4dor&3 horse battery"  # a passphrase with spaces, given quoted (Hydra's grammar)
NUMERIC = "98765432109876543210"  # a token made of digits: Hydra composes it as an int


def _everywhere(root: Path, secret: str, *texts: str) -> list[str]:
    """Every path name, file byte and text holding `secret` or a piece of it that would still give
    it away (`Tr0ub4dor`, `horse battery` as written or as a dir name spells it)."""
    pieces = {secret, *secret.split(" ")[:1], *(f"horse{sep}battery" for sep in " _" if " " in secret)}
    found = [
        f"{s!r} in {p}"
        for p in root.rglob("*")
        for s in pieces
        if s in str(p.relative_to(root)) or (p.is_file() and s.encode() in p.read_bytes())
    ]
    return found + [f"{s!r} in output" for t in texts for s in pieces if s in t]


@pytest.mark.parametrize("value", [f'"{QUOTED}"', NUMERIC], ids=["quoted", "numeric"])
def test_secret_of_any_spelling_reaches_no_byte(tmp_path, value):
    """Issue 22 items 1-2: a quoted value under a secret key was written in clear in run.json,
    summary.json, .hydra/overrides.yaml, .hydra/hydra.yaml and the run dir's name; a number under a
    secret key in .hydra/config.yaml, run.json's config and every training_args.bin. Default dirs,
    from a scratch dir, as the user ran it."""
    import torch

    r = ablate(
        "train",
        f"+method.args.hub_token={value}",
        "method.args.max_steps=2",
        "method.args.save_steps=1",
        cwd=tmp_path,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    secret = value.strip('"')
    assert _everywhere(tmp_path, secret, r.stdout, r.stderr) == []
    run_dir = next((tmp_path / "outputs" / "runs").glob("*/*"))
    assert {".hydra", "run.json", "summary.json", "checkpoints", "model"} <= {
        p.name for p in run_dir.iterdir()
    }
    bins = list(run_dir.rglob("training_args.bin"))
    assert len(bins) == 3  # checkpoint-1, checkpoint-2, model/
    for path in bins:  # pickled, a number is not its digits: load it as the user would
        assert torch.load(path, weights_only=False).hub_token == "***", path
    info = json.loads((run_dir / "run.json").read_text())
    assert info["config"]["method"]["args"]["hub_token"] == "***"
    assert info["overrides"] == [
        "+method.args.hub_token=***",
        "method.args.max_steps=2",
        "method.args.save_steps=1",
    ]


def test_credential_in_a_data_path_is_masked_in_the_error_line(tmp_path):
    """Issue 22 item 3: a bad data file under a path holding a credential: the one-line error names
    the file with the credential masked (it was printed in clear on stderr)."""
    folder = tmp_path / LITERAL
    folder.mkdir()
    (folder / "prefs.jsonl").write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": \n')
    r = ablate(
        "train",
        "data=jsonl",
        f"data.train_path={folder / 'prefs.jsonl'}",
        "method.args.max_steps=2",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "line 2 is not valid JSON" in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().startswith("ablate: error: ") and len(r.stderr.strip().splitlines()) == 1
    assert "/***/prefs.jsonl" in r.stderr
    assert _leaks(tmp_path / "run", r.stdout, r.stderr) == []


@pytest.mark.parametrize(
    "launch",
    [("train", "-m"), ("train", "-m", "hydra/launcher=local_parallel")],
    ids=["basic", "local_parallel"],
)
def test_the_launchers_echo_of_each_job_is_masked(tmp_path, launch):
    """Issue 32: Hydra's launchers echo each job's overrides (`[HYDRA] #0 : ... +method.args.hub_token=...`), and
    Hydra logs a failed job's overrides: masked like every other line. The jobs fail at once (beta=0)."""
    plain = "plainsecretvalue99"
    r = ablate(
        *launch,
        "method=dpo,dpo_hinge",
        "method.args.beta=0",
        f"+method.args.hub_token={plain}",
        f"notes=key {PASSWORD}",
        f"tags=[{LITERAL}]",
        cwd=tmp_path,
        env=ENV,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "#0 : method=dpo" in out and "hub_token=***" in out, out[-3000:]
    assert plain not in out and _leaks(tmp_path, r.stdout, r.stderr) == []
