"""`ablate fetch smollm2_135m`: build the cached model dir now and print its path."""

from __future__ import annotations

from typing import Any

from ablate.cli.exits import user_errors


def fetch_cmd(args: Any) -> None:
    """`ablate fetch smollm2_135m [--force]`: build the cached model dir now (model=smollm2_135m does
    it on first use) and print its path, e.g. for `model=local model.path=$(ablate fetch smollm2_135m)`."""
    from ablate.errors import ConfigError

    # what it can fetch: said with the name given, not argparse's choice list
    if args.model != "smollm2_135m":
        from ablate.cli import refuse

        refuse(
            f"ablate fetch: no model '{args.model}' to fetch (the one it fetches: smollm2_135m)",
            "ablate fetch",
        )
    from ablate.models.smollm2 import fetch

    with user_errors(ConfigError):
        print(fetch(force=args.force))
