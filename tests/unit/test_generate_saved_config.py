"""`ablate generate` rebuilds a run's starting model from its `.hydra/config.yaml`; a config composed from a
user's own config dir may still hold `${ablate_default:}` (ablate's conf/ has them filled in as it loads):
the saved config resolves it, rather than "Unsupported interpolation type"."""

from __future__ import annotations

from pathlib import Path

import yaml

from ablate.cli.generate import starting_model


def test_a_saved_config_with_ablate_default_builds_the_starting_model(tmp_path: Path):
    (tmp_path / ".hydra").mkdir()
    model = {"_target_": "ablate.models.tiny", "hidden_size": 32, "num_layers": "${ablate_default:}"}
    (tmp_path / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"model": model}))
    _, net = starting_model(tmp_path)
    assert net.config.hidden_size == 32
    assert net.config.num_hidden_layers == 2  # tiny's own default, read from its signature


def test_an_empty_or_blank_completion_says_so():
    from ablate.cli.generate import shown

    assert shown(" abcd") == " abcd"
    assert shown("") == "(empty: the model wrote no text)"
    assert shown(" \n") == "(only whitespace: ' \\n')"
