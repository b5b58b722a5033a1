"""The group `schema`: ablate's structured configs (`- /schema@args: DPOArgs`, `- /schema@_here_: Adapters`:
the dataclasses of ablate.schema, ablate.config.compose.stored()) and a user's own config class
(`- override /schema@args: my_dpo.MyDPOConfig`: its module imported, its node composed as ablate's schema's
with the user's own fields added, `_target_` the user's class), or a user's function with settings of its own
(`- /schema@_here_: my_losses.margin_sigmoid`: a node of its keyword settings, from its signature).
Each node is built when a composition selects it (scheme `ablate-schema`): a command builds only those it
uses. `SchemaSearchPath` puts the source on the search path of every composition of ablate's conf/, whatever
`hydra.searchpath` a command gives.

Hydra instantiates config sources only from the `hydra_plugins` namespace (by scheme).
"""

from __future__ import annotations

import builtins
import functools
import importlib
import re

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin

GROUP = "schema"
SCHEME = "ablate-schema"
DOTTED = re.compile(
    r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$"
)  # module.Class: a user's (ablate's own have no dot)


@functools.lru_cache(maxsize=1)
def ablate_schemas() -> dict[str, type]:
    from ablate.config.compose import stored
    from ablate.schema.nodes import Columns

    return {c.__name__: c for c in [*stored(), Columns]}


class SchemaSource(ConfigSource):
    """The group `schema`'s options: ablate's schema classes by name, a user's by dotted path."""

    @staticmethod
    def scheme() -> str:
        return SCHEME

    def _name(self, config_path: str) -> str | None:
        group, _, name = config_path.removesuffix(".yaml").partition("/")
        return name if group == GROUP and (DOTTED.match(name) or name in ablate_schemas()) else None

    def load_config(self, config_path: str) -> ConfigResult:
        from ablate.config.compose import function_node, node, user_node

        name = self._name(config_path)
        if name is None:
            raise ConfigLoadError(f"Config not found : {config_path}")
        if name in ablate_schemas():
            config = node(ablate_schemas()[name])
        else:
            module, _, cls = name.rpartition(".")
            try:
                found = getattr(importlib.import_module(module), cls)
            except (ImportError, AttributeError) as e:
                raise ConfigLoadError(
                    f"schema/{name}: cannot import {name} ({e}); is its module on PYTHONPATH?"
                ) from e
            config = user_node(found) if isinstance(found, type) else function_node(found)
        return ConfigResult(
            config=config,
            path=f"{self.scheme()}://{self.path}",
            provider=self.provider,
            header={"package": None},
        )

    def available(self) -> bool:
        return True

    def is_group(self, config_path: str) -> bool:
        return config_path in ("", GROUP)

    def is_config(self, config_path: str) -> bool:
        return self._name(config_path) is not None

    def list(self, config_path: str, results_filter: ObjectType | None) -> builtins.list[str]:
        if config_path == GROUP and results_filter in (None, ObjectType.CONFIG):
            return sorted(ablate_schemas())  # a user's are not known before they are named
        return []


class SchemaSearchPath(SearchPathPlugin):
    """The group `schema` on the search path of ablate's conf/ (its YAMLs select their structured configs)."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from ablate.paths import conf_dir

        conf = conf_dir()
        paths = [e.path for e in search_path.get_path()]
        if any(p in (conf, f"file://{conf}") for p in paths) and f"{SCHEME}://user" not in paths:
            search_path.append("ablate", f"{SCHEME}://user")
