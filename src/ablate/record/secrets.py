"""Secrets never reach a file ablate writes, a run dir's name, or an echoed command.

A value is masked as `***` when
- its key looks secret: a last name part `token`, `secret`, `password`, `passwd`, `key`, `api_key`, ...
  (`hub_token`, `WANDB_API_KEY`, `+model.token=...`), except tokenizer special tokens (`pad_token`);
- it looks like a credential anywhere in a string: `hf_...` (Hugging Face) or `sk-...` (OpenAI and
  the like), 20+ characters after the prefix;
- it equals (or contains) the value of a secret-looking environment variable (HF_TOKEN, WANDB_API_KEY,
  MY_SERVICE_PASSWORD...), 8+ characters long;
- it equals (or contains) a value given on the command line under a secret-looking key (`remember`),
  8+ characters long: quoted (`'+method.args.hub_token="a b c"'`), a number, any other type;
- it is the password of a URL (`https://user:pw@host/...`).

Under a secret-looking key every value is masked whatever its type (a number, a list, a mapping);
only null, booleans and `${...}` interpolations are kept.

`${oc.env:HF_TOKEN}` in an override or config stays as written in every record (it is not a secret,
and it lets a resume read the variable again); only the resolved value would be.

Where it applies: rundir.write_json (run.json, summary.json), the run dir name (ablate.cli), the
echoed sweep/resume command, W&B's config and command line (ablate.logger.wandb), every log record the
launching process makes (`mask_log_records`: Hydra's launchers echo each job's overrides), and, through the
Hydra callback `MaskRecords` (conf/config.yaml), the .hydra/*.yaml files and multirun.yaml that Hydra
writes itself, plus every line logged to ablate.log and the console.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

MASK = "***"
_SECRET_WORDS = (
    r"token|secret|password|passwd|passphrase|key|apikey|api_key|access_key|private_key|credentials?"
)
_SECRET_NAME = re.compile(rf"(?i)(?:^|[_\-])(?:{_SECRET_WORDS})$|(?i:secret|password|api_?key|access_?key)")
_NOT_SECRET = re.compile(
    r"(?i)(?:^|_)(?:pad|eos|bos|unk|sep|cls|mask|special|chat|additional_special)_token$"
)
_CREDENTIAL = re.compile(r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_\-]{20,})")
# scheme://user:PASSWORD@host
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][\w+.\-]*://[^/\s:@]+:)[^/\s@]+(?=@)")
# key=value in overrides, override_dirname and command lines: `+method.args.hub_token=hf_...`; a value
# is a run of quoted strings (Hydra's grammar: "a b", 'a,b'), interpolations and plain characters
_ASSIGNMENT = re.compile(
    r"(?P<key>[A-Za-z_][\w.@/\-]*)="
    r"(?P<value>(?:\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|\$\{[^}]*\}|[^,\s\]'\"])+)"
)
_MIN_VALUE = 8  # shorter values are masked under their key only: masking every "1" in a log would say nothing
_remembered: set[str] = set()  # secret values given on the command line (`remember`)


def secret_name(name: str) -> bool:
    """Whether a config key or environment variable name looks like it holds a secret."""
    leaf = str(name).rsplit(".", 1)[-1].rsplit("/", 1)[-1]
    return bool(_SECRET_NAME.search(leaf)) and not _NOT_SECRET.search(leaf)


def secret_env_values() -> list[str]:
    """Values of the secret-looking environment variables right now, and the secret values given as
    overrides (`remember`), longest first."""
    vals = {v for k, v in os.environ.items() if secret_name(k) and len(v) >= _MIN_VALUE} | _remembered
    return sorted(vals, key=len, reverse=True)


def remember(overrides: list[str]) -> None:
    """Mask from now on, wherever it appears, the value of every override whose key looks secret
    (`+method.args.hub_token="Tr0ub4dor&3 horse battery"`, `+x.api_key=98765432109876543210`): a value
    quoted, or of another type than a string, reaches records in other spellings than its override's."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for override in overrides:
        key, sep, raw = str(override).partition("=")
        # an interpolation is not a secret: quoted, or escaped as Hydra's sweeper passes it to a job
        # ($\{...\})
        if (
            not sep
            or not secret_name(key.lstrip("+~"))
            or raw.strip("'\"").replace("\\", "").startswith("${")
        ):
            continue
        values = {raw, raw.strip("'\"")}
        with contextlib.suppress(Exception):  # not Hydra's syntax: the raw text is masked all the same
            parsed = parser.parse_override(str(override))
            if not parsed.is_sweep_override():
                values |= {str(parsed.value()), parsed.get_value_element_as_str()}
        _remembered.update(v for v in values if len(v) >= _MIN_VALUE and v != MASK)


def mask_text(s: str, env: list[str] | None = None) -> str:
    """`s` with every secret in it replaced by ***: env values, credential-shaped strings, and the
    value of any `secret_key=value` assignment (unless it is an unresolved `${...}`)."""
    for v in secret_env_values() if env is None else env:
        s = s.replace(v, MASK)
    s = _CREDENTIAL.sub(MASK, s)
    s = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, s) if "://" in s else s

    def assignment(m: re.Match[str]) -> str:
        value = m.group("value")
        if (
            secret_name(m.group("key").lstrip("+~"))
            and value.strip("'\"") not in (MASK, "null", "")
            and not value.strip("'\"").replace("\\", "").startswith("${")
        ):
            return f"{m.group('key')}={MASK}"
        return m.group(0)

    return _ASSIGNMENT.sub(assignment, s) if "=" in s else s


def mask(obj: Any, env: list[str] | None = None, key: str = "") -> Any:
    """`obj` (nested dicts, lists, strings, numbers) with secrets masked: under a secret-looking key
    every value becomes *** whole (a number too; a mapping's or list's every value), except null,
    booleans and `${...}` interpolations; elsewhere strings are masked by `mask_text`."""
    env = secret_env_values() if env is None else env
    secret = bool(key) and secret_name(key)
    if isinstance(obj, dict):
        return {k: mask(v, env, key if secret else str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [mask(v, env, key) for v in obj]
    if isinstance(obj, str):
        if secret and obj and not obj.strip("'\"").startswith("${") and obj != "???":
            return MASK
        return mask_text(obj, env)
    if secret and isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return MASK
    return obj


def config_record(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config for a record (W&B), masked, with `${oc.env:...}` values left as written."""

    raw = OmegaConf.to_container(cfg, resolve=False)
    resolved = OmegaConf.to_container(cfg, resolve=True)

    def keep_env(r: Any, v: Any) -> Any:
        if isinstance(r, str) and "${oc.env:" in r:
            return r
        if isinstance(r, dict) and isinstance(v, dict):
            return {k: keep_env(r.get(k), x) for k, x in v.items()}
        if isinstance(r, list) and isinstance(v, list) and len(r) == len(v):
            return [keep_env(a, b) for a, b in zip(r, v)]
        return v

    return mask(keep_env(raw, resolved))


def mask_file(path: Path) -> None:
    """Rewrite a YAML file Hydra wrote (.hydra/*.yaml, multirun.yaml) with its secrets masked;
    left byte-identical when there is none. Atomic: a reader never sees half a file."""
    import yaml

    try:
        text = path.read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        return
    data = mask(yaml.safe_load(text))
    new = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1_000_000)
    if yaml.safe_load(new) == yaml.safe_load(text):
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(new)
    os.replace(tmp, path)


def mask_log_records() -> None:
    """Every log record this process makes from now on carries its message masked: Hydra's launchers
    echo each job's overrides (`[HYDRA] #0 : ... +method.args.hub_token=...`) and log a failed job's,
    through handlers Hydra configures itself (a filter on them would not survive its next
    configuration; the record factory does). Once per process."""
    made = logging.getLogRecordFactory()
    if getattr(made, "masks_secrets", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = made(*args, **kwargs)
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record is logging's to report, as it would be unmasked
            return record
        masked = mask_text(msg)
        if masked != msg:
            record.msg, record.args = masked, None
        return record

    factory.masks_secrets = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


class MaskedStream:
    """A text stream whose writes are masked: Hydra writes a failed job's overrides to stderr itself
    ("Error executing job with overrides: [...]"), not through logging."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(mask_text(text) if "=" in text or _remembered else text)
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _MaskFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        masked = mask_text(msg)
        if masked != msg:
            record.msg, record.args = masked, None
        return True


class MaskRecords(Callback):
    """Hydra callback: Hydra writes .hydra/*.yaml (and a multirun's multirun.yaml) itself, before the
    task starts; `on_job_start` (env_set already applied) masks them, masks sys.argv (W&B records
    the command line), and masks every log line from here on (ablate.log, console)."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        hc = config.hydra
        # in a sweep's worker too (it never saw the command line); as written: `${oc.env:...}` stays
        # unresolved
        remember([str(o) for o in OmegaConf.to_container(hc.overrides.task, resolve=False)])
        out = Path(str(hc.runtime.output_dir))
        if hc.output_subdir is not None:
            for path in sorted((out / str(hc.output_subdir)).glob("*.yaml")):
                mask_file(path)
        if str(hc.mode) == "RunMode.MULTIRUN" or hc.mode == "MULTIRUN":
            mask_file(Path(str(hc.sweep.dir)) / "multirun.yaml")
        sys.argv[:] = [mask_text(a) for a in sys.argv]
        flt = _MaskFilter()
        for handler in logging.getLogger().handlers:
            if not any(isinstance(f, _MaskFilter) for f in handler.filters):
                handler.addFilter(flt)
