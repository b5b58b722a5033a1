"""The `ablate` command line: one argparse parser with a subcommand per command (ablate.cli.parser)."""

from __future__ import annotations

import importlib

import pytest

from ablate.cli import COMMANDS, main


@pytest.mark.parametrize("cmd", sorted(set(COMMANDS) - {"train"}))
def test_each_command_has_its_own_help(capsys, cmd):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith(f"usage: ablate {cmd}") and "options:" in out


def test_the_top_help_lists_every_command(capsys):
    main(["--help"])
    out = capsys.readouterr().out
    # a name longer than argparse's column stands on its own line, its help below it
    assert all(f"    {cmd} " in out or f"    {cmd}\n" in out for cmd in COMMANDS) and "examples:" in out


def _capture(monkeypatch, cmd: str) -> list:
    seen: list = []
    module, func = COMMANDS[cmd]
    monkeypatch.setattr(importlib.import_module(module), func, seen.append)
    return seen


def test_train_hands_its_arguments_to_hydra_untouched(monkeypatch):
    seen = _capture(monkeypatch, "train")
    argv = ["-m", "--cfg", "job", "method=dpo,dpo_hinge", "+x=--y", "~z", "--config-dir", "d", "-h"]
    main(["train", *argv])
    assert seen == [argv]


def test_flags_and_overrides_in_any_order(monkeypatch):
    seen = _capture(monkeypatch, "sweep")
    main(["sweep", "--dry-run", "dpo_loss", "seed=1", "--detach", "method.args.beta=0.2"])
    args = seen[0]
    assert (args.name, args.overrides, args.dry_run, args.detach, args.resume) == (
        "dpo_loss",
        ["seed=1", "method.args.beta=0.2"],
        True,
        True,
        False,
    )


@pytest.mark.parametrize(
    "argv,line",
    [
        (["trian"], "ablate: error: 'trian' is not a command (did you mean 'ablate train'? "),
        (
            ["ls", "--bogus"],
            "ablate: error: '--bogus' is not an option of ablate ls (ablate ls --help for usage)",
        ),
        (
            ["eval"],
            "ablate: error: ablate eval: the following arguments are required: run_dir (ablate eval --help for usage)",
        ),
        (
            ["data", "preview", "-n", "0"],
            "ablate: error: ablate data: argument -n: -n needs a positive number, got '0'",
        ),
    ],
)
def test_a_mistake_is_one_line_and_exit_2(capsys, argv, line):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(line) and err.count("\n") == 1
