"""`ablate generate RUN_DIR --prompt "..."`: what did the run learn? Completions from its `model/`.

`model/` holds either a full model (config.json) or, for a `+peft` run, a LoRA adapter
(adapter_config.json) whose base is rebuilt from the run's own model config (`.hydra/config.yaml`),
so adapters on a base built from code (model=tiny) load too. Prompts go through the tokenizer's
chat template when it has one (as training formatted them), else they are used as plain text.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ablate.cli import parser as one_line_parser
from ablate.run import rundir


def load_run_model(run_dir: Path) -> tuple[Any, Any]:
    """(tokenizer, model) saved in `<run_dir>/model/`, adapters applied."""
    from transformers import AutoTokenizer

    from ablate.errors import ConfigError
    from ablate.models import pretrained

    model_dir = run_dir / rundir.MODEL
    if (model_dir / "config.json").is_file():
        return pretrained(str(model_dir))
    if not (model_dir / "adapter_config.json").is_file():
        raise ConfigError(f"{run_dir} has no saved model ({model_dir} holds neither config.json nor an adapter; "
                          "is the run finished? `ablate ls` shows its status)")
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from peft import PeftModel

    from ablate.models.adapters import quiet_peft

    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    _, base = instantiate(cfg.model)  # the run's own base model (built from code or loaded)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    with quiet_peft():
        return tokenizer, PeftModel.from_pretrained(base, str(model_dir))


def read_prompts(prompts: list[str], path: Path | None) -> list[Any]:
    """`--prompt` strings, then the `prompt` field (a string or a messages list) of each JSONL row."""
    out: list[Any] = list(prompts)
    if path is not None:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip():
                row = json.loads(line)
                if "prompt" not in row:
                    raise ValueError(f"{path} line {number}: no 'prompt' field")
                out.append(row["prompt"])
    return out


def render(tokenizer: Any, prompt: Any) -> str:
    """The prompt as the model sees it: chat template with the generation prompt, when there is one."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in messages)


def starting_model(run_dir: Path) -> tuple[Any, Any]:
    """(tokenizer, model) the run started from: its model config (`.hydra/config.yaml`) built again."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from ablate.errors import ConfigError

    config = run_dir / ".hydra" / "config.yaml"
    if not config.is_file():
        raise ConfigError(f"{run_dir} has no .hydra/config.yaml: its starting model is unknown")
    return instantiate(OmegaConf.load(config).model)


def complete(tokenizer: Any, model: Any, prompts: list[Any], max_new_tokens: int, temperature: float,
             seed: int) -> list[str]:
    """One completion per prompt from `model`: greedy at temperature 0, else sampled (seeded)."""
    import torch
    from transformers import set_seed

    model.eval()
    set_seed(seed)
    out_texts = []
    for prompt in prompts:
        text = render(tokenizer, prompt)
        enc = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        sample = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, **sample)
        out_texts.append(tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True))
    return out_texts


def generate(run_dir: Path, prompts: list[Any], max_new_tokens: int = 64, temperature: float = 0.0,
             seed: int = 0, before: bool = False) -> list[dict[str, Any]]:
    """One completion per prompt from the run's model/; with `before`, also the starting model's
    (`before`: what training changed, side by side)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars: the completions are the output
    tokenizer, model = load_run_model(run_dir)
    after = complete(tokenizer, model, prompts, max_new_tokens, temperature, seed)
    rows = [{"prompt": p, "completion": c} for p, c in zip(prompts, after)]
    if before:
        del model
        start_tok, start = starting_model(run_dir)
        for row, c in zip(rows, complete(start_tok, start, prompts, max_new_tokens, temperature, seed)):
            row["before"] = c
    return rows


def generate_cmd(argv: list[str]) -> None:
    """`ablate generate RUN_DIR (--prompt P ... | --prompts FILE.jsonl) [--max-new-tokens N] [--temperature T] [--json]
    [--before]`."""
    parser = one_line_parser(prog="ablate generate", description="completions from a run's saved model")
    parser.add_argument("run_dir", type=Path, help="a run dir (its model/ is loaded, LoRA adapters included)")
    parser.add_argument("--prompt", action="append", default=[], help="a user message (repeat for several)")
    parser.add_argument("--prompts", type=Path, help="JSONL file, one {\"prompt\": ...} per line (string or messages)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per completion (64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--json", action="store_true", help="one JSON object per line: prompt, completion")
    parser.add_argument("--before", action="store_true",
                        help="also the completion of the model the run started from (what training changed)")
    args = parser.parse_args(argv)
    from ablate.errors import USER_ERRORS

    try:
        rundir.check_readable(args.run_dir)
        prompts = read_prompts(args.prompt, args.prompts)
        if not prompts:
            raise ValueError("give --prompt TEXT or --prompts FILE.jsonl")
        rows = generate(args.run_dir, prompts, args.max_new_tokens, args.temperature, args.seed, args.before)
    except (*USER_ERRORS, ValueError, FileNotFoundError) as e:
        print(f"ablate: error: {e}", file=sys.stderr)
        sys.exit(2)
    for row in rows:
        if args.json:
            print(json.dumps(row))
        elif "before" in row:
            print(f">>> {row['prompt'] if isinstance(row['prompt'], str) else json.dumps(row['prompt'])}\n"
                  f"before training: {row['before']}\nafter training:  {row['completion']}\n")
        else:
            print(f">>> {row['prompt'] if isinstance(row['prompt'], str) else json.dumps(row['prompt'])}\n"
                  f"{row['completion']}\n")
