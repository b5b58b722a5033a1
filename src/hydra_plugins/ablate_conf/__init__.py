"""ablate's conf/ as Hydra reads it: each `key: ${ablate_default:}` filled in from the function it calls.

A node of conf/ that calls an ablate function (`_target_`) writes `label_smoothing: ${ablate_default:}` so the
default is declared once, in the function's signature (ablate.config.targets.keyword_default). This source
(scheme `ablate-conf`: Hydra's file source, put in place of conf/'s own entry by `ConfSearchPath`) fills the
value in as the file is read, against the `_target_` that file names: a user's override of `_target_` keeps
the values of its siblings (Hydra's rule), and the composed, saved and logged config holds numbers, not
placeholders. A value that cannot be filled in at load (its `_target_` set elsewhere) stays an interpolation,
which the `ablate_default` resolver answers.

Hydra instantiates config sources and search-path plugins only from the `hydra_plugins` namespace.
"""

from __future__ import annotations

from typing import Any

from hydra._internal.core_plugins.file_config_source import FileConfigSource
from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.config_source import ConfigResult
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import DictConfig, ListConfig, OmegaConf

SCHEME = "ablate-conf"
PLACEHOLDER = "${ablate_default:}"


class ConfSource(FileConfigSource):
    """Hydra's file source for conf/, filling `${ablate_default:}` from each node's own `_target_`."""

    @staticmethod
    def scheme() -> str:
        return SCHEME

    def load_config(self, config_path: str) -> ConfigResult:
        result = super().load_config(config_path)
        fill_defaults(result.config)
        return result


def fill_defaults(cfg: Any) -> None:
    """Replace every `key: ${ablate_default:}` under `cfg` whose node names a literal `_target_` by that
    function's default for `key`, read from its source (no import)."""
    from ablate.config.targets import keyword_default

    if isinstance(cfg, ListConfig):
        for i in range(len(cfg)):
            fill_defaults(cfg._get_node(i))  # the node, unresolved
        return
    if not isinstance(cfg, DictConfig):
        return
    target = cfg._get_node("_target_") if "_target_" in cfg else None
    literal = target is not None and not OmegaConf.is_interpolation(cfg, "_target_")
    for key in list(cfg.keys()):
        node = cfg._get_node(key)
        if literal and node is not None and node._value() == PLACEHOLDER:
            cfg[key] = keyword_default(str(target._value()), str(key))
        elif isinstance(node, (DictConfig, ListConfig)):
            fill_defaults(node)


class ConfSearchPath(SearchPathPlugin):
    """Reads ablate's own conf/ (the primary config dir of ablate's commands) through `ConfSource`."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from ablate.paths import conf_dir

        try:
            conf = conf_dir()
        except FileNotFoundError:
            return
        for element in search_path.get_path():
            if element.provider == "main" and names_conf(element.path, conf):
                element.path = f"{SCHEME}://{conf}"


def names_conf(path: str, conf: str) -> bool:
    """Whether a search-path entry is ablate's conf/: as Hydra wrote it, or as `ConfSearchPath` renamed it."""
    return path in (conf, f"file://{conf}", f"{SCHEME}://{conf}")
