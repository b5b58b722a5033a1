"""A user's own config class as a `schema` option: `- override /schema@args: my_dpo.MyDPOConfig`.

ablate's method schemas are structured configs in Hydra's ConfigStore (`schema/DPOArgs`, ...:
ablate.config.store). A config class of the user's (a subclass of DPOConfig with a field of its own) is
not known before its module is imported, so this source (scheme `ablate-schema`, on conf/config.yaml's
search path) serves `schema/<module>.<Class>`: it imports the class and composes its node as ablate's
(its schema's fields and the user's own, with their defaults), `_target_` the user's class.

Hydra instantiates config sources only from the `hydra_plugins` namespace (by scheme).
"""

from __future__ import annotations

import builtins
import importlib
import re

from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource

GROUP = "schema"
DOTTED = re.compile(
    r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$"
)  # module.Class: a user's (ablate's own have no dot)


class SchemaSource(ConfigSource):
    """The group `schema`'s options that name a class by its dotted path."""

    @staticmethod
    def scheme() -> str:
        return "ablate-schema"

    def _name(self, config_path: str) -> str | None:
        group, _, name = config_path.removesuffix(".yaml").partition("/")
        return name if group == GROUP and DOTTED.match(name) else None

    def load_config(self, config_path: str) -> ConfigResult:
        name = self._name(config_path)
        if name is None:
            raise ConfigLoadError(f"Config not found : {config_path}")
        module, _, cls = name.rpartition(".")
        try:
            found = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError) as e:
            raise ConfigLoadError(
                f"schema/{name}: cannot import {name} ({e}); is its module on PYTHONPATH?"
            ) from e
        from ablate.config.store import user_node

        return ConfigResult(
            config=user_node(found),
            path=f"{self.scheme()}://{self.path}",
            provider=self.provider,
            header=ConfigSource._get_header_dict(""),
        )

    def available(self) -> bool:
        return True

    def is_group(self, config_path: str) -> bool:
        return config_path in ("", GROUP)

    def is_config(self, config_path: str) -> bool:
        return self._name(config_path) is not None

    def list(self, config_path: str, results_filter: ObjectType | None) -> builtins.list[str]:
        return []  # no option is known before it is named
