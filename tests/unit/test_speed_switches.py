"""The speed switches are declared once, in `ablate.schema.speed.SpeedSwitches`; Hydra composes the `speed`
node from it (ablate.config.compose): conf/speed/on.yaml selects it and declares no switch of its own;
off.yaml switches every path off."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ablate.errors import ConfigError
from ablate.paths import conf_dir
from ablate.schema.speed import SpeedSwitches

SPEED = Path(conf_dir()) / "speed"


def test_speed_on_is_the_dataclass_and_declares_nothing_itself():
    from hydra import compose, initialize_config_dir

    from ablate.config.compose import register_resolvers

    on = OmegaConf.to_container(OmegaConf.load(SPEED / "on.yaml"))
    assert on == {"defaults": [{"/schema@_here_": "SpeedSwitches"}, "_self_"]}
    register_resolvers()
    with initialize_config_dir(str(conf_dir()), version_base=None):
        composed = OmegaConf.to_container(compose("config").speed)
    assert composed.pop("_target_") == "ablate.speed.plan.SpeedSwitches"
    assert composed == {f.name: f.default for f in dataclasses.fields(SpeedSwitches)}


def test_off_yaml_switches_every_field_off():
    off = OmegaConf.to_container(OmegaConf.load(SPEED / "off.yaml"))
    assert off.pop("defaults") == [{"/schema@_here_": "SpeedSwitches"}, "_self_"]
    assert off == {
        f.name: False for f in dataclasses.fields(SpeedSwitches) if f.name != "show"
    }  # not a switch
    assert SpeedSwitches.off() == SpeedSwitches(**off)


def test_the_plans_paths_are_the_dataclass_switches():
    from ablate.speed import plan

    assert plan.SpeedSwitches is SpeedSwitches
    assert list(plan.PATHS) == [f.name for f in dataclasses.fields(SpeedSwitches)][: len(plan.PATHS)]
    assert set(plan.PATHS) == {f.name for f in dataclasses.fields(SpeedSwitches)} - {
        "unverified_devices",
        "show",
    }


def test_a_switch_is_checked_where_it_is_made():
    with pytest.raises(ConfigError, match=r"^speed.padding_free=yes: must be true or false$"):
        SpeedSwitches(padding_free="yes")
