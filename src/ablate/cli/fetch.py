"""`ablate fetch smollm2_135m`: build the cached model dir now and print its path."""

from __future__ import annotations

import sys


def fetch_cmd(argv: list[str]) -> None:
    """`ablate fetch smollm2_135m [--force]`: build the cached model dir now (model=smollm2_135m does
    it on first use) and print its path, e.g. for `model=local model.path=$(ablate fetch smollm2_135m)`."""
    from ablate.errors import ConfigError

    if not argv or argv[0] != "smollm2_135m":
        from ablate.cli import refuse

        refuse(f"ablate fetch: no model '{argv[0]}' to fetch (the one it fetches: smollm2_135m)" if argv else
               "ablate fetch: which model?", "ablate fetch smollm2_135m [--force]")
    from ablate.models.smollm2 import fetch

    try:
        print(fetch(force="--force" in argv[1:]))
    except ConfigError as e:
        print(f"ablate: error: {e}", file=sys.stderr)
        sys.exit(2)
