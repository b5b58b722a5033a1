"""`ablate data preview [overrides] [-n N]`: the first N training examples as the model will see them.
`ablate data check [overrides]`: the splits' sizes and format, and how many eval prompts also occur in
the training data (`ablate.data.overlap`).

Both compose the same config as `ablate train` (model, data, method). Preview loads only the tokenizer
(no weights, for the models ablate knows), and runs each row through the method's own tokenisation and
truncation (`ablate.data.tokenize`): the text after the chat template, the tokens that count towards
the loss marked, prompt/completion/total lengths, and what truncation cut or dropped. Neither trains
nor writes anything.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from ablate.cli.exits import one_line_errors
from ablate.schema.method import MethodSpec

OPEN, CLOSE = "⟦", "⟧"  # around loss tokens when the output is not a colour terminal
GREEN, RESET = "\033[1;32m", "\033[0m"


def load_tokenizer(model_cfg: DictConfig) -> tuple[Any, bool]:
    """The model's tokenizer without its weights where ablate knows how; (tokenizer, weights_built)."""
    from hydra.utils import instantiate

    target = model_cfg.get("_target_", "")
    if target == "ablate.models.tiny":
        from ablate.models.tokenizer import byte_tokenizer

        return byte_tokenizer(), False
    if target in ("ablate.models.pretrained", "ablate.models.smollm2_135m"):
        from transformers import AutoTokenizer

        from ablate.errors import ConfigError

        if target == "ablate.models.smollm2_135m":
            from ablate.models.smollm2 import fetch

            path, kwargs = str(fetch()), {}
        else:
            path = str(model_cfg.path)
            kwargs = {
                "revision": model_cfg.get("revision"),
                "trust_remote_code": model_cfg.get("trust_remote_code", False),
            }
        try:
            tok = AutoTokenizer.from_pretrained(path, **kwargs)
        except OSError as e:
            raise ConfigError(
                f"model.path: cannot load a tokenizer from '{path}': {str(e).splitlines()[0]}"
            ) from e
        if tok.pad_token is None:  # as ablate.models.pretrained does
            tok.pad_token = tok.eos_token
        return tok, False
    return instantiate(model_cfg)[0], True  # a user's model builder: only it knows its tokenizer


def _kind(cfg: DictConfig) -> str:
    """The method's kind of data (`method.data_kind`, ablate.data.kinds)."""
    from ablate.data.kinds import KINDS
    from ablate.errors import ConfigError

    kind = MethodSpec.of(cfg.method).data_kind
    if kind is None:
        raise ConfigError(
            f"ablate data: method={cfg.method.get('name')} names no kind of data, so its rows cannot be "
            f"shown: set method.data_kind to one of {', '.join(KINDS)} (ablate.data.kinds)"
        )
    return kind


def _method_args(cfg: DictConfig) -> Callable[[str], Any]:
    """method.args.<name>, else the args class's default (the value the trainer would get)."""
    from hydra.utils import get_class

    cls = get_class(cfg.method.args._target_)
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    return lambda name: cfg.method.args.get(name, defaults.get(name))


class Printer:
    def __init__(self, tokenizer: Any, color: bool) -> None:
        self.tok, self.color = tokenizer, color

    def text(self, prompt_ids: list[int], loss_ids: list[int]) -> str:
        p = self.tok.decode(prompt_ids, skip_special_tokens=False)
        c = self.tok.decode(loss_ids, skip_special_tokens=False)
        return p + self._mark(c)

    def masked(self, prompt_ids: list[int], ids: list[int], mask: list[int]) -> str:
        """The prompt, then `ids` with each run of mask-1 tokens (assistant turns) marked."""
        out, start = [self.tok.decode(prompt_ids, skip_special_tokens=False)], 0
        for i in range(1, len(ids) + 1):
            if i == len(ids) or mask[i] != mask[start]:
                text = self.tok.decode(ids[start:i], skip_special_tokens=False)
                out.append(self._mark(text) if mask[start] else text)
                start = i
        return "".join(out)

    def _mark(self, text: str) -> str:
        return f"{GREEN}{text}{RESET}" if self.color else f"{OPEN}{text}{CLOSE}"


def _notes(
    full: dict[str, list[int]], cut: dict[str, list[int]] | None, max_length: Any, max_prompt: Any
) -> list[str]:
    if cut is None:
        return [
            f"DROPPED: the prompt ({len(full['prompt_ids'])} tokens) alone fills max_length={max_length}; "
            "no completion token would be left (set method.args.max_prompt_length to keep its end)"
        ]
    notes = []
    if len(cut["prompt_ids"]) < len(full["prompt_ids"]):
        notes.append(
            f"prompt cut from {len(full['prompt_ids'])} to its last {len(cut['prompt_ids'])} tokens "
            f"(max_prompt_length={max_prompt})"
        )
    for key in cut:
        if key not in ("prompt_ids", "completion_mask") and len(cut[key]) < len(full[key]):
            notes.append(
                f"{key[:-4]} cut from {len(full[key])} to its first {len(cut[key])} tokens "
                f"(max_length={max_length})"
            )
    return notes


def _compose(overrides: list[str], config_dir: str | None, packages: bool = True) -> DictConfig:
    """The config `ablate train` would run, checked as it checks it (`config_dir`: train's --config-dir;
    `packages`: its optional packages are installed, which `ablate plan` only names)."""
    from hydra import compose, initialize_config_dir

    from ablate.config.compose import register_resolvers
    from ablate.paths import conf_dir

    register_resolvers()
    if config_dir is not None:  # what `ablate train --config-dir` does: the dir joins the config search path
        overrides = [f"hydra.searchpath=[file://{os.path.abspath(config_dir)}]", *overrides]
    try:
        with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
    except Exception as e:  # a mistake in `overrides` (serve-rollouts adds its own): in their words
        from ablate.config.hints import one_line
        from ablate.errors import ConfigError

        line = one_line(e, overrides)
        if line is None:
            raise
        raise ConfigError(line) from e
    from ablate.config.checks import check
    from ablate.config.code_checks import check_method_args

    check(cfg, packages=packages)  # what `ablate train` would refuse, in the same words
    check_method_args(cfg)
    return cfg


def _train_name(data_cfg: DictConfig) -> str:
    """The training data as the user named it (a path, a hub id, a packaged task's file)."""
    if data_cfg.get("train_path"):
        return str(data_cfg.train_path)
    if data_cfg.get("_target_") == "ablate.data.packaged":
        return f"{data_cfg.name}_train.jsonl"
    return str(data_cfg.get("path") or data_cfg.get("name") or data_cfg.get("_target_"))


def warn_shared(data: Any, data_cfg: DictConfig) -> int | None:
    """One warning line (stderr) when eval prompts also occur in the training data; the eval rows checked
    (None: no eval split)."""
    from ablate.data.overlap import asked, shared_prompts, warning

    if data.eval is None:
        return None
    shared, total = shared_prompts(asked(data.train), asked(data.eval))
    if line := warning(shared, total, _train_name(data_cfg)):
        print(f"ablate: {line}", file=sys.stderr)
    return None if shared else total


def check_data(overrides: list[str], config_dir: str | None = None, out: Any = sys.stdout) -> None:
    """`ablate data check`: the splits' sizes and format, and the eval prompts the training data holds."""
    from hydra.utils import instantiate

    from ablate.data.formats import detect
    from ablate.data.kinds import tokenized

    cfg = _compose(overrides, config_dir)
    kind = _kind(cfg)
    data = instantiate(cfg.data)
    tokens = tokenized(kind, data.train.column_names)
    fmt = "already tokenized" if tokens else detect(data.train, kind, cfg.method.name)
    print(
        f"{cfg.method.name}: {len(data.train)} train rows ({_train_name(cfg.data)}), "
        f"{0 if data.eval is None else len(data.eval)} eval rows; format: {fmt}",
        file=out,
    )
    if data.eval is None:
        print(
            "held out: no eval split, nothing to check (data.eval_path; a hub dataset's data.eval_split)",
            file=out,
        )
    elif (clean := warn_shared(data, cfg.data)) is not None:
        print(f"held out: none of the {clean} eval prompts occurs in the training data", file=out)


def preview(overrides: list[str], n: int, config_dir: str | None = None, out: Any = sys.stdout) -> None:
    """Print the first `n` train examples of the composed config (`config_dir`: like train's --config-dir)."""
    from hydra.utils import get_method, instantiate

    cfg = _compose(overrides, config_dir)
    from ablate.data.formats import detect  # torch: only once the config is known to be good
    from ablate.data.kinds import KINDS

    kind = _kind(cfg)
    row_ids = get_method(KINDS[kind].row)  # how the method tokenises one row
    arg = _method_args(cfg)
    tok, built = load_tokenizer(cfg.model)
    data = instantiate(cfg.data)
    warn_shared(data, cfg.data)
    rows = data.train.select(range(min(n, len(data.train))))
    # KTO: pair i -> its desirable, undesirable
    if kind == "unpaired" and "label" not in data.train.column_names:
        from datasets.utils.logging import disable_progress_bar

        from ablate.data.unpaired import unpair

        disable_progress_bar()
        m = len(rows)
        rows = unpair(rows).select([j for i in range(m) for j in (i, m + i)][:n])
    color = out.isatty() and "NO_COLOR" not in os.environ
    show = Printer(tok, color)
    legend = "green" if color else f"between {OPEN} and {CLOSE}"
    legend = KINDS[kind].preview + (f" {legend}" if KINDS[kind].preview == "loss tokens" else "")
    pretokenized = set(KINDS[kind].ids) <= set(data.train.column_names)  # e.g. examples/custom_batch
    fmt_name = "already tokenized" if pretokenized else detect(data.train, kind, cfg.method.name)
    print(
        f"{cfg.method.name} on {len(data.train)} train rows, format: {fmt_name}; {legend}"
        + ("; (the model's weights were built: ablate cannot load its tokenizer alone)" if built else ""),
        file=out,
    )
    max_length = arg("max_length")
    for i, row in enumerate(rows):
        print(f"\n===== example {i} =====", file=out)
        if kind == "prompt":
            _show_prompt(row["prompt_ids"] if pretokenized else row_ids(tok, row, i), tok, arg, out)
        elif kind == "reward":
            _show_reward(row_ids(tok, row, i), tok, max_length, out)
        else:
            _show_tokens(row, i, kind, row_ids, tok, arg, pretokenized, show, out)


def _show_prompt(prompt_ids: list[int], tok: Any, arg: Any, out: Any) -> None:
    """A prompt-only example (GRPO and its kin): the prompt as the model sees it, after max_prompt_length."""
    full = {"prompt_ids": prompt_ids}
    mpl = arg("max_prompt_length")
    cut = {"prompt_ids": full["prompt_ids"][-mpl:] if mpl else full["prompt_ids"]}
    print(
        f"prompt: {len(cut['prompt_ids'])} tokens; completions are sampled "
        f"(up to max_completion_length={arg('max_completion_length')} tokens, all in the loss)",
        file=out,
    )
    print(tok.decode(cut["prompt_ids"], skip_special_tokens=False), file=out)
    for note in _notes(full, cut, None, mpl):
        print(f"note: {note}", file=out)


def _show_tokens(
    row: dict[str, Any],
    i: int,
    kind: str,
    row_ids: Callable[..., dict[str, list[int]]],
    tok: Any,
    arg: Any,
    pretokenized: bool,
    show: Printer,
    out: Any,
) -> None:
    """A preference, SFT or unpaired example: its sides' tokens after truncation, the loss tokens marked
    (`row_ids`: how the method tokenises one row, ablate.data.kinds)."""
    from ablate.data import tokenize
    from ablate.data.kinds import KINDS

    max_length = arg("max_length")
    if kind == "unpaired":
        print(f"label: {'desirable' if row['label'] else 'undesirable'}", file=out)
        row = {"prompt": row["prompt"], "completion": row["completion"]}
    if pretokenized:
        full = {k: row[k] for k in KINDS[kind].ids}
        cut = tokenize.truncate(
            full,
            max_length,
            *((arg("max_prompt_length"), arg("max_completion_length")) if kind == "preference" else ()),
        )
    elif kind == "preference":
        full = row_ids(tok, row, i)
        cut = tokenize.truncate(full, max_length, arg("max_prompt_length"), arg("max_completion_length"))
    else:
        full = row_ids(tok, row, i, arg("completion_only_loss"), bool(arg("assistant_only_loss")))
        cut = tokenize.truncate(full, max_length)
    shown = cut or full
    p = len(shown["prompt_ids"])
    parts = [k for k in shown if k not in ("prompt_ids", "completion_mask")]
    mask = shown.get("completion_mask")
    lengths = ", ".join(f"{k[:-4]} {len(shown[k])}" for k in parts)
    loss = f"{sum(mask)} assistant tokens in the loss" if mask is not None else "loss"
    totals = " / ".join(str(p + len(shown[k])) for k in parts)
    print(
        f"tokens: prompt {p} (no loss), {lengths} ({loss}); total {totals} (max_length={max_length})",
        file=out,
    )
    for k in parts:
        if len(parts) > 1:
            print(f"--- {k[:-4]} ---", file=out)
        print(
            show.masked(shown["prompt_ids"], shown[k], mask)
            if mask is not None
            else show.text(shown["prompt_ids"], shown[k]),
            file=out,
        )
    for note in _notes(full, cut, max_length, arg("max_prompt_length")):
        print(f"note: {note}", file=out)


def _show_reward(ids: dict[str, list[int]], tok: Any, max_length: Any, out: Any) -> None:
    """A reward model's pair (its ids): each side the whole prompt + completion, dropped over max_length."""
    sizes = " / ".join(f"{k[:-4]} {len(v)}" for k, v in ids.items())
    print(f"tokens: {sizes} (max_length={max_length}; the score is read at the last token)", file=out)
    for k, v in ids.items():
        print(f"--- {k[:-4]} ---\n{tok.decode(v, skip_special_tokens=False)}", file=out)
    if max_length is not None and max(map(len, ids.values())) > max_length:
        print(f"note: DROPPED: a side is longer than max_length={max_length} (TRL's filter)", file=out)


def data_cmd(args: Any) -> None:
    """`ablate data preview|check [overrides] [-n N] [--config-dir DIR]`: see `preview` and `check_data`
    (arguments: ablate.cli.parser)."""
    overrides, n, config_dir = args.overrides, args.n, args.config_dir
    with one_line_errors():
        if args.action == "check":
            check_data(overrides, config_dir)
        else:
            preview(overrides, n, config_dir)
