"""`ablate serve-rollouts [key=value ...] [--host H] [--port P] [--dry-run]`: a vLLM rollout server for GRPO's
`method/rollouts=vllm_server`, in the foreground on this machine's GPUs or CPU (Ctrl-C stops it).

It composes the config `ablate train` would run with the same overrides (`method=grpo` when none names a
method; `method/rollouts=vllm_server` added when none names the rollouts) and serves that config's model, with
the engine settings of `method.rollouts.*` and, unless `method.rollouts.max_model_len` is set, the longest
prompt of the data plus `max_completion_length` as its context (what the trainer's own engine would size
itself to). The server is vLLM's OpenAI-compatible server in its RL mode, as `trl vllm-serve` starts it
(ablate.rollouts.server.serve_command), with ablate's gloo weight transfer on a CPU. `--dry-run` prints the
command instead of running it.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

from omegaconf import DictConfig

from ablate.cli.exits import fail, one_line_errors

SERVER = "ablate.rollouts.server.VLLMServerGenerator"


def serve_cmd(args: Any) -> None:
    """`ablate serve-rollouts` (arguments: ablate.cli.arguments)."""
    from ablate.cli.data import _compose

    if not 0 < args.port < 65536:
        fail(f"--port {args.port}: must be a TCP port (1-65535)")
    overrides = list(args.overrides)
    if not any(o.split("=", 1)[0] in ("method", "+experiment", "experiment") for o in overrides):
        overrides.insert(0, "method=grpo")
    if not any(o.split("=", 1)[0] in ("method/rollouts", "+method/rollouts") for o in overrides):
        overrides.append("method/rollouts=vllm_server")
    with one_line_errors():
        cfg = _compose(overrides, args.config_dir)
        command = _command(cfg, args.host, args.port)
    if args.dry_run:
        print(shlex.join(command))
        return
    from ablate.rollouts.server import serve_env

    url = f"http://{args.host}:{args.port}"
    print(f"ablate serve-rollouts: {url} (train with method/rollouts=vllm_server method.rollouts.url={url})")
    sys.stdout.flush()
    os.execve(sys.executable, command, serve_env())


def _command(cfg: DictConfig, host: str, port: int) -> list[str]:
    from ablate.errors import ConfigError
    from ablate.rollouts.server import default_backend, serve_command

    engine = cfg.method.get("rollouts")
    if engine is None or engine.get("_target_") != SERVER:
        raise ConfigError(
            f"ablate serve-rollouts serves method/rollouts=vllm_server; this config's method.rollouts is "
            f"{engine.get('_target_') if engine is not None else 'null'}"
        )
    source, load, tokenizer = _model_source(cfg.model)
    max_len = engine.max_model_len or _longest_row(cfg, tokenizer)
    return serve_command(
        source,
        host,
        port,
        backend=engine.backend or default_backend(),
        load_format=load,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        kv_cache_gib=engine.kv_cache_gib,
        max_model_len=max_len,
        dtype=engine.dtype,
        enforce_eager=engine.enforce_eager,
    )


def _model_source(model_cfg: DictConfig) -> tuple[str, str, Any]:
    """Where the server loads the model from (a directory or a hub id), its load format, and the tokenizer. A
    model node with a `path` is served from it; another (the tiny model, SmolLM2's preset) is built once here:
    its directory, or, built from config, its config alone in a directory of its own with dummy weights, which
    the trainer's first push replaces."""
    import tempfile

    from hydra.utils import instantiate
    from transformers import AutoTokenizer

    if model_cfg.get("path") not in (None, "???"):
        path = str(model_cfg.path)
        return path, "auto", AutoTokenizer.from_pretrained(path, revision=model_cfg.get("revision"))
    tokenizer, model = instantiate(model_cfg)
    path = str(getattr(model, "name_or_path", "") or "")
    if os.path.isfile(os.path.join(path, "config.json")):
        return path, "auto", tokenizer
    out = tempfile.mkdtemp(prefix="ablate-serve-")
    model.config.save_pretrained(out)
    return out, "dummy", tokenizer


def _longest_row(cfg: DictConfig, tokenizer: Any) -> int:
    """The longest prompt + completion of the config's data (how the trainer's own engine sizes itself)."""
    from hydra.utils import instantiate

    from ablate.rollouts.prompts import longest_row, prompt_rows

    a = cfg.method.args
    if a.max_prompt_length is not None:
        return int(a.max_prompt_length + a.max_completion_length)
    data = instantiate(cfg.data)
    cuts = {"train": prompt_rows(data.train, tokenizer, None)[1]}
    if data.eval is not None:
        cuts["eval"] = prompt_rows(data.eval, tokenizer, None, "eval")[1]
    return int(longest_row(cuts, None, a.max_completion_length))
