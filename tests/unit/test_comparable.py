"""ablate.analysis.comparable: which metrics two arms may be ranked on, read from each run's composed config
(`method.defined_by` in .hydra/config.yaml); and every method's declaration names keys its config has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from ablate.analysis import comparable
from ablate.analysis.runs import Group, Run, flatten
from ablate.config.compose import register_resolvers
from ablate.paths import conf_dir

METHODS = sorted(p.stem for p in Path(conf_dir(), "method").glob("*.yaml"))
DPO_DECLARED = {"loss": ["method.dpo_loss", "method.args.beta"], "rewards/margins": ["method.args.beta"]}


def composed(*overrides: str) -> dict[str, Any]:
    """The config `ablate train` would record in .hydra/config.yaml (unresolved), nested."""
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return OmegaConf.to_container(compose(config_name="config", overrides=list(overrides)), resolve=False)


@pytest.mark.parametrize("method", METHODS)
def test_every_declared_key_is_in_its_methods_config(method: str) -> None:
    """A key that names nothing (a typo, a renamed field) would make every arm agree on it, silently. Checked
    in the method whose YAML writes the declaration (rloo inherits grpo's, and drops one of its groups)."""
    cfg = composed(f"method={method}")
    flat, declared = flatten(cfg), cfg["method"].get("defined_by") or {}
    assert declared, f"conf/method/{method}.yaml declares no defined_by (its loss at least is its own)"
    if "defined_by:" not in Path(conf_dir(), "method", f"{method}.yaml").read_text():
        return
    for metric, keys in declared.items():
        for key in keys:
            assert any(k == key or k.startswith(key + ".") for k in flat), (
                f"{method}: {metric} -> {key}: no such key"
            )


def arm(root: Path, label: str, config: dict[str, Any] | None, method: str = "dpo") -> Group:
    """One arm of one run whose .hydra/config.yaml holds `config` (None: no config file at all)."""
    path = root / label
    (path / ".hydra").mkdir(parents=True)
    if config is not None:
        (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    return Group(label, [Run(path=path, summary={"method": method}, overrides={})], arm=label)


def dpo(
    loss: str = "sigmoid", beta: float = 0.1, smoothing: float = 0.0, declared: dict | None = None
) -> dict[str, Any]:
    node = {"_target_": f"ablate.losses.dpo.{loss}", "_partial_": True} | (
        {"label_smoothing": smoothing} if loss == "sigmoid" else {}
    )
    return {
        "method": {
            "name": "dpo",
            "defined_by": DPO_DECLARED if declared is None else declared,
            "dpo_loss": node,
            "args": {"beta": beta, "max_steps": 60},
        }
    }


def test_two_losses_leave_the_loss_unranked_and_the_rewards_ranked(tmp_path: Path) -> None:
    a, b = arm(tmp_path, "sigmoid", dpo("sigmoid")), arm(tmp_path, "hinge", dpo("hinge"))
    assert comparable.differing("loss", a, b) == {"method.dpo_loss": ("sigmoid", "hinge")}
    assert comparable.differing("eval_loss", a, b) == {
        "method.dpo_loss": ("sigmoid", "hinge")
    }  # held-out: the same
    assert comparable.differing("rewards/margins", a, b) == {}  # beta*log(pi/ref) whatever the loss
    assert comparable.differing("rewards/accuracies", a, b) == {}  # declared by nobody


def test_beta_and_a_loss_parameter_are_named_by_their_values(tmp_path: Path) -> None:
    a, b = arm(tmp_path, "a", dpo(beta=0.1)), arm(tmp_path, "b", dpo(beta=0.2))
    assert comparable.differing("rewards/margins", a, b) == {"method.args.beta": ("0.1", "0.2")}
    c, d = arm(tmp_path, "c", dpo(smoothing=0.0)), arm(tmp_path, "d", dpo(smoothing=0.1))
    assert comparable.differing("loss", c, d) == {
        "method.dpo_loss": ("label_smoothing=0.0", "label_smoothing=0.1")
    }
    e = arm(
        tmp_path, "e", dpo(beta=0.1, declared={})
    )  # declared nothing (a user's method): FALLBACK, method name only
    assert comparable.differing("rewards/margins", e, arm(tmp_path, "f", dpo(beta=0.5, declared={}))) == {}


def test_different_methods_say_so_and_a_run_without_a_config_falls_back_to_its_method(tmp_path: Path) -> None:
    kto = {
        "method": {
            "name": "kto",
            "defined_by": {"loss": ["method.kto_loss"]},
            "kto_loss": {"_target_": "x.kto"},
        }
    }
    assert comparable.differing("loss", arm(tmp_path, "dpo", dpo()), arm(tmp_path, "kto", kto, "kto")) == {
        "method.name": ("dpo", "kto")
    }
    bare_a, bare_b = arm(tmp_path, "bare_a", None, "dpo"), arm(tmp_path, "bare_b", None, "sft")
    assert comparable.differing("loss", bare_a, bare_b) == {"method.name": ("dpo", "sft")}
    assert comparable.differing("loss", bare_a, arm(tmp_path, "bare_c", None, "dpo")) == {}


def test_not_compared_line() -> None:
    losses = {"method.dpo_loss": ("sigmoid", "hinge")}
    assert comparable.not_compared_line({"eval_loss": [losses]}, ["eval_rewards/margins"], asked=False) == (
        "not compared: eval_loss is defined by each arm's dpo_loss (sigmoid vs hinge); ranking the held-out metrics instead"
    )
    assert comparable.not_compared_line({"loss": [losses]}, ["rewards/margins"], asked=False) == (
        "not compared: loss is defined by each arm's dpo_loss (sigmoid vs hinge); ranking the others instead "
        "(`ablate eval RUN_DIR` on each run adds held-out ones)"
    )
    three = [{"method.dpo_loss": ("sigmoid", "hinge")}, {"method.dpo_loss": ("sigmoid", "ipo")}]
    assert comparable.not_compared_line({"loss": three, "eval_loss": three}, [], asked=True) == (
        "not compared: loss, eval_loss are defined by each arm's dpo_loss (sigmoid, hinge, ipo); nothing left to rank: "
        "pick another --metric"
    )
    assert comparable.not_compared_line({}, ["loss"], asked=False) == ""


def test_a_declaration_leaves_a_runs_identity_as_it_was() -> None:
    """A run started before its method declared `defined_by` resumes as the same run (run.json's hash)."""
    from ablate.record.identity import identity

    cfg = composed("method=dpo")
    before = {**cfg, "method": {k: v for k, v in cfg["method"].items() if k != "defined_by"}}
    assert identity(OmegaConf.create(cfg))["config_hash"] == identity(OmegaConf.create(before))["config_hash"]
    changed = {**cfg, "method": {**cfg["method"], "args": {**cfg["method"]["args"], "beta": 0.5}}}
    assert (
        identity(OmegaConf.create(changed))["config_hash"] != identity(OmegaConf.create(cfg))["config_hash"]
    )
