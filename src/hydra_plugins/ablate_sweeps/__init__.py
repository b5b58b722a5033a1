"""Sweep files as Hydra's `sweep` config group, read from a folder of any name.

The design card puts the shipped sweep definitions in a top-level `sweeps/` folder; Hydra names a
group after its folder, so a plain search path would call them `sweeps`. `SweepsSource` (scheme
`ablate-sweeps`) presents the YAML files of one folder, or one file, as the group `sweep`: `+sweep=NAME`
composes `<folder>/NAME.yaml` (Hydra's own format, `# @package _global_` header included).

    hydra.searchpath: [ablate-sweeps://shipped]       # conf/config.yaml: ablate's sweeps/
    ablate-sweeps:///abs/dir/my_sweep.yaml            # a user's own file (ablate sweep PATH adds it)

Hydra instantiates config sources only from the `hydra_plugins` namespace (by scheme).
"""

from __future__ import annotations

import builtins
import os
import re

from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from omegaconf import OmegaConf

GROUP = "sweep"


class SweepsSource(ConfigSource):
    """The group `sweep` from a folder of sweep files (`shipped`: ablate's own `sweeps/`) or a single file."""

    def __init__(self, provider: str, path: str) -> None:
        super().__init__(provider=provider, path=path)
        location = path.split("://", 1)[-1]
        if location == "shipped":
            from ablate.paths import sweeps_dir

            location = sweeps_dir()
        self.dir, self.only = (
            (os.path.dirname(location), os.path.basename(location))
            if location.endswith(".yaml")
            else (location, None)
        )

    @staticmethod
    def scheme() -> str:
        return "ablate-sweeps"

    def _file(self, config_path: str) -> str | None:
        """The file behind `sweep/NAME(.yaml)`, or None when this source does not hold it."""
        group, _, name = (config_path if config_path.endswith(".yaml") else f"{config_path}.yaml").partition(
            "/"
        )
        if group != GROUP or not name or (self.only is not None and name != self.only):
            return None
        return os.path.join(self.dir, name)

    def load_config(self, config_path: str) -> ConfigResult:
        path = self._file(config_path)
        if path is None or not os.path.isfile(path):
            raise ConfigLoadError(f"Config not found : {config_path}")
        with open(path, encoding="utf-8") as f:
            found = re.search(r"^\s*#\s*@package\s+(\S+)", f.read(512), re.M)  # `# @package _global_`
            header = {"package": found.group(1) if found else None}
            f.seek(0)
            return ConfigResult(
                config=OmegaConf.load(f),
                path=f"{self.scheme()}://{self.dir}",
                provider=self.provider,
                header=header,
            )

    def available(self) -> bool:
        return os.path.isdir(self.dir)

    def is_group(self, config_path: str) -> bool:
        return config_path in ("", GROUP) and self.available()

    def is_config(self, config_path: str) -> bool:
        path = self._file(config_path)
        return path is not None and os.path.isfile(path)

    def list(self, config_path: str, results_filter: ObjectType | None) -> builtins.list[str]:
        if config_path == "":
            return [GROUP] if results_filter in (None, ObjectType.GROUP) and self.available() else []
        if config_path != GROUP or results_filter == ObjectType.GROUP or not self.available():
            return []
        names = [self.only] if self.only else sorted(f for f in os.listdir(self.dir) if f.endswith(".yaml"))
        return [n[:-5] for n in names if os.path.isfile(os.path.join(self.dir, n))]
