"""Which names and values ablate.record.secrets treats as secrets."""

from __future__ import annotations

import pytest

from ablate.record.secrets import MASK, mask, mask_text, secret_name


@pytest.mark.parametrize(
    "name",
    [
        "hub_token",
        "model.token",
        "WANDB_API_KEY",
        "HF_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "password",
        "db_passwd",
        "openai_api_key",
        "key",
        "client_secret",
    ],
)
def test_secret_names(name):
    assert secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "pad_token",
        "eos_token",
        "max_new_tokens",
        "exclude_keys",
        "token_ids",
        "max_length",
        "override_dirname",
        "monkey",
        "num_tokens",
    ],
)
def test_harmless_names(name):
    assert not secret_name(name)


def test_mask_text_overrides_and_credentials(monkeypatch):
    monkeypatch.setenv("MY_PASSWORD", "s3cret-value")
    s = "seed=1,+model.token=abc123,x=hf_" + "a" * 30 + ",y=s3cret-value,+t.token=${oc.env:HF_TOKEN}"
    assert mask_text(s) == f"seed=1,+model.token={MASK},x={MASK},y={MASK},+t.token=${{oc.env:HF_TOKEN}}"


def test_mask_nested():
    got = mask({"a": {"api_key": "abcd", "pad_token": "<pad>", "n": 3}, "l": ["+x.password=pw"]})
    assert got == {"a": {"api_key": MASK, "pad_token": "<pad>", "n": 3}, "l": [f"+x.password={MASK}"]}


def test_sweep_job_identity_masks_secrets_and_ignores_a_rotated_token(monkeypatch):
    """identity.identity (run.json's config and its hash) masks with the same rules as every
    other record: a resolved ${oc.env:...} secret and a secret-named key never appear, and a rotated
    token leaves the job's hash unchanged (the resume must not call it a different job)."""
    from omegaconf import OmegaConf

    from ablate.record.identity import identity

    cfg = OmegaConf.create(
        {"model": {"token": "${oc.env:MY_SERVICE_PASSWORD}", "path": "/data/m"}, "lr": 0.1}
    )
    monkeypatch.setenv("MY_SERVICE_PASSWORD", "first-password-123")
    first = identity(cfg)
    assert first["config"] == {"model": {"token": MASK, "path": "/data/m"}, "lr": 0.1}
    monkeypatch.setenv("MY_SERVICE_PASSWORD", "rotated-password-456")
    assert identity(cfg)["config_hash"] == first["config_hash"]
    assert identity(OmegaConf.merge(cfg, {"lr": 0.2}))["config_hash"] != first["config_hash"]
