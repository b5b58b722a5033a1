"""`ablate generate RUN_DIR --prompt "..."`: what did the run learn? Completions from its `model/`.

`model/` holds either a full model (config.json) or, for a `+peft` run, a LoRA adapter
(adapter_config.json) whose base is rebuilt from the run's own model config (`.hydra/config.yaml`),
so adapters on a base built from code (model=tiny) load too.

A prompt is formatted as the run's training formatted its rows (run.json's `data_format`, recorded
when the run was built; for an older run, its data loaded again from `.hydra/config.yaml`), by the
same code (`ablate.data.tokenize.tokenize_prompt`): a run trained on plain-text prompts gets the
text as it is (the tokenizer's own special tokens), one trained on chat messages gets a plain prompt
as a user turn through the chat template with the generation prompt. Which one is printed first.
`--format plain|chat` overrides it. When `--prompts FILE` rows carry a `completion`, the count of
completions equal to it (whitespace at the ends aside) is printed last.

A run whose training prompts offered tools (GRPO's `method.args.tools`, by default the data's, and its
environment; SFT on data with `tools`) gets them here too: each prompt is a conversation offering the run's
tools, rendered by the rollouts' own code (`ablate.rollouts.tool_calls.ToolFormat`, in the run's
`tool_call_format`), and generated as the rollouts and `ablate eval` generate it (`ToolGenerator` around the
shared-prompt generator): each call runs, its result is appended, and generation goes on until a turn calls
nothing. Each call and its result are printed, then the answer. `--max-new-tokens` defaults to the run's own
budget for all turns (`method.args.max_completion_length`, or the data's), room for a call and an answer.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablate.cli.exits import user_errors
from ablate.record import rundir


def load_run_model(run_dir: Path) -> tuple[Any, Any]:
    """(tokenizer, model) saved in `<run_dir>/model/`, adapters applied."""
    from transformers import AutoTokenizer

    from ablate.errors import ConfigError
    from ablate.models import pretrained

    model_dir = run_dir / rundir.MODEL
    if (model_dir / "config.json").is_file():
        return pretrained(str(model_dir))
    if not (model_dir / "adapter_config.json").is_file():
        raise ConfigError(
            f"{run_dir} has no saved model ({model_dir} holds neither config.json nor an adapter; "
            "is the run finished? `ablate ls` shows its status)"
        )
    from hydra.utils import instantiate
    from peft import PeftModel

    from ablate.models.adapters import quiet_peft
    from ablate.models.heads import with_head

    cfg = saved_config(run_dir / ".hydra" / "config.yaml")
    _, base = instantiate(cfg.model)  # the run's own base model (built from code or loaded)
    base = with_head(base, cfg.get("method"))  # method=reward: the score head the adapter was trained with
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    with quiet_peft():
        return tokenizer, PeftModel.from_pretrained(base, str(model_dir))


def read_prompts(prompts: list[str], path: Path | None) -> list[dict[str, Any]]:
    """`--prompt` strings, then each JSONL row (its `prompt`: a string or a messages list; `tools`,
    `chat_template_kwargs` and `completion` kept), as rows {prompt, ...}."""
    out: list[dict[str, Any]] = [{"prompt": p} for p in prompts]
    if path is not None:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path} line {number}: not JSON ({e})") from None
                if not isinstance(row, dict) or "prompt" not in row:
                    raise ValueError(f"{path} line {number}: no 'prompt' field")
                out.append(row)
        if len(out) == len(prompts):
            raise ValueError(f"--prompts {path} is empty: no rows in it (JSON lines, each with a 'prompt')")
    return out


def trained_format(run_dir: Path) -> dict[str, Any]:
    """How the run's training rows were formatted (`ablate.data.formats.describe`): run.json's
    `data_format`, or, for a run made before ablate recorded it, its data loaded again."""
    info = rundir.read_json(run_dir / rundir.RUN) or {}
    if isinstance(info.get("data_format"), dict):
        return {**info["data_format"], "source": "run.json"}
    from hydra.utils import instantiate

    from ablate.data.formats import describe
    from ablate.errors import ConfigError

    config = run_dir / ".hydra" / "config.yaml"
    if not config.is_file():
        raise ConfigError(
            f"{run_dir}: neither run.json nor .hydra/config.yaml says how its prompts were formatted; "
            "give --format plain or --format chat"
        )
    return {
        **describe(instantiate(saved_config(config).data).train, None),
        "source": ".hydra/config.yaml's data",
    }


def describe_format(chat: bool, fmt: dict[str, Any] | None) -> str:
    """The line saying how the prompts were formatted, and why."""
    how = (
        "chat template, a plain prompt as the user turn, with the generation prompt"
        if chat
        else "plain text, as written (the tokenizer's own special tokens)"
    )
    if fmt is None:
        return f"prompts: {how} (--format)"
    rows = " ".join(
        x for x in (fmt.get("format"), "(conversational)" if fmt["conversational"] else None) if x
    )
    return f"prompts: {how}, as the run's training rows{f' ({rows})' if rows else ''} were ({fmt['source']})"


def prompt_ids(tokenizer: Any, row: dict[str, Any], chat: bool) -> list[int]:
    """The prompt's token ids as training made them (`tokenize_prompt`, GRPO's and TRL's prompt
    encoding); with `chat`, a plain-string prompt becomes one user message first. A messages prompt
    always goes through the chat template (there is no plain rendering of a conversation)."""
    from ablate.data.tokenize import tokenize_prompt

    prompt = row["prompt"]
    if chat and isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    return tokenize_prompt(tokenizer, {**row, "prompt": prompt})


def expected(row: dict[str, Any]) -> str | None:
    """The row's reference completion as text (a messages completion: its contents), if it has one."""
    value = row.get("completion")
    if isinstance(value, list):
        value = "".join(str(m.get("content", "")) for m in value if isinstance(m, dict))
    return value if isinstance(value, str) else None


def starting_model(run_dir: Path) -> tuple[Any, Any]:
    """(tokenizer, model) the run started from: its model config (`.hydra/config.yaml`) built again."""
    from hydra.utils import instantiate

    from ablate.errors import ConfigError

    config = run_dir / ".hydra" / "config.yaml"
    if not config.is_file():
        raise ConfigError(f"{run_dir} has no .hydra/config.yaml: its starting model is unknown")
    return instantiate(saved_config(config).model)


def saved_config(path: Path) -> Any:
    """A run's `.hydra/config.yaml`, with ablate's resolvers registered for the `${ablate_*}` it may hold."""
    from omegaconf import OmegaConf

    from ablate.config.compose import register_resolvers

    register_resolvers()
    return OmegaConf.load(path)


DEFAULT_TOKENS = 64  # --max-new-tokens of a run without tools
TOOL_TOKENS = 256  # ... of a tool run that records no budget: room for calls, their results and an answer


@dataclass
class Sampling:
    """What the shared-prompt generator reads (ablate.rollouts.generation.SamplingArgs): --temperature, no
    top-k or top-p (as `model.generate` samples the prompts of a run without tools here)."""

    temperature: float
    max_completion_length: int
    top_p: float = 1.0
    top_k: int = 0


def run_toolbox(run_dir: Path, tokenizer: Any) -> tuple[Any, int | None]:
    """(the tools the run's training prompts offered, as `ablate.rollouts.turns.Toolbox` in the format they
    were shown, the run's budget of new tokens over all turns), from `.hydra/config.yaml`; (None, None)
    without tools. GRPO and its kin: method.args.tools (the data's by default), environment, tool_call_format,
    max_tool_calling_iterations, tool_timeout, max_completion_length; SFT: data.tools (its rows' `tools`
    column, which ablate.data.tokenize renders as `tool_call_format: auto` does)."""
    config = run_dir / ".hydra" / "config.yaml"
    if not config.is_file():
        return None, None
    from omegaconf import OmegaConf

    from ablate.rewards import resolve
    from ablate.rollouts.tool_calls import ToolFormat
    from ablate.rollouts.turns import Toolbox

    cfg = saved_config(config)
    args, data = cfg.method.get("args") or {}, cfg.get("data") or {}
    key = "method.args.tools" if "tools" in args else "data.tools"
    node = args.get("tools") if "tools" in args else data.get("tools")
    specs = OmegaConf.to_container(node, resolve=True) if node is not None else []
    env = args.get("environment")
    if not specs and env is None:
        return None, None
    tools = [resolve.function(t, f"{key}[{i}]") for i, t in enumerate(specs)]
    environment = (
        None
        if env is None
        else resolve.environment(
            OmegaConf.to_container(env, resolve=True) if OmegaConf.is_config(env) else env,
            "method.args.environment",
        )
    )
    box = Toolbox(
        ToolFormat(tokenizer, args.get("tool_call_format", "auto")),
        tools,
        environment,
        args.get("max_tool_calling_iterations"),
        args.get("tool_timeout"),
        args.get("max_tool_result_length"),  # None: the budget of the turns (complete_with_tools)
    )
    return box, args.get("max_completion_length") or data.get("max_completion_length")


def tool_prompt_ids(box: Any, row: dict[str, Any], index: int = 0) -> list[int]:
    """A prompt offering the run's tools, rendered as the run's training did (a plain prompt: a user turn)."""
    prompt = row["prompt"]
    return box.prompt_ids([{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt, index)


def complete_with_tools(
    tokenizer: Any,
    model: Any,
    rows: list[dict[str, Any]],
    box: Any,
    max_new_tokens: int,
    temperature: float,
    seed: int,
) -> list[dict[str, Any]]:
    """One rollout per prompt row, as GRPO's and `ablate eval`'s (ToolGenerator around the shared-prompt
    generator; greedy at temperature 0, else sampled, seeded): {completion: the last assistant turn's text,
    turns: the assistant turns (their `tool_calls`) and the tool results, in order, calls: how many ran}."""
    from transformers import set_seed

    from ablate.rollouts.generation import SharedPromptGenerator, as_completions
    from ablate.rollouts.turns import ToolGenerator

    model.eval()
    set_seed(seed)
    inner = SharedPromptGenerator(
        Sampling(temperature if temperature > 0 else 1.0, max_new_tokens),
        tokenizer,
        do_sample=temperature > 0,
    )
    box.max_result_tokens = box.max_result_tokens or max_new_tokens  # as the rollouts: the budget
    generate = ToolGenerator(inner, box, tokenizer, max_new_tokens)
    out = []
    for i, row in enumerate(rows):
        prompt = (
            row["prompt"]
            if not isinstance(row["prompt"], str)
            else [{"role": "user", "content": row["prompt"]}]
        )
        ids = generate.start([{**row, "prompt": prompt, "prompt_ids": tool_prompt_ids(box, row, i)}])
        done = as_completions(generate(model, ids))
        turns = done.messages[0]
        last = next((m for m in reversed(turns) if m.get("role") == "assistant"), {})
        row = {"completion": str(last.get("content") or ""), "turns": turns, "calls": done.tool_calls[0]}
        out.append({**row, "malformed": generate.malformed[0]} if generate.malformed[0] else row)
    return out


def show_turns(turns: list[dict[str, Any]], malformed: str | None = None) -> list[str]:
    """A rollout's lines: each call (`call: name({arguments})`, one that could not be read said so), each
    result (`result: ...`), then the answer (the turn that calls nothing), or a line saying none came within
    the budget, or that the last turn is a call that could not be read (`malformed`: why; the rollouts'
    ToolFormat.read), not an answer."""
    lines = []
    for i, m in enumerate(turns):
        if m.get("role") == "tool":
            lines.append(f"result: {m.get('content')}")
        elif not m.get("tool_calls") and malformed and i == len(turns) - 1:
            lines.append(f"malformed call (not run: {malformed}): {m.get('content') or ''}")
            return [*lines, "answer: (none: the last turn is a tool call that could not be read)"]
        elif not m.get("tool_calls"):
            lines.append(f"answer: {m.get('content') or ''}")
        else:
            lines += [f"says:   {m['content']}"] if m.get("content") else []
            for c in m["tool_calls"]:
                body = c.get("function", c)
                unread = body.get("name") == "unknown" and not body.get("arguments")  # parse_hermes's
                name = "(malformed: the result says why)" if unread else body.get("name")
                lines.append(f"call:   {name}({json.dumps(body.get('arguments'))})")
    if not turns or turns[-1].get("role") != "assistant" or turns[-1].get("tool_calls"):
        lines.append(
            "answer: (none: the turns ran out of --max-new-tokens, or of the run's "
            "max_tool_calling_iterations)"
        )
    return lines


def complete(
    tokenizer: Any,
    model: Any,
    rows: list[dict[str, Any]],
    chat: bool,
    max_new_tokens: int,
    temperature: float,
    seed: int,
) -> list[str]:
    """One completion per prompt row from `model`: greedy at temperature 0, else sampled (seeded)."""
    import torch
    from transformers import set_seed

    model.eval()
    set_seed(seed)
    out_texts = []
    for row in rows:
        ids = torch.tensor([prompt_ids(tokenizer, row, chat)])
        sample = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                **sample,
            )
        out_texts.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    return out_texts


def generate(
    run_dir: Path,
    prompts: list[Any],
    max_new_tokens: int | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    before: bool = False,
    chat: bool | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """One completion per prompt (a string, messages, or a row {prompt, ...}) from the run's model/;
    with `before`, also the starting model's (what training changed, side by side). Prompts are
    formatted as the run's training rows were (`chat`: None), or as `chat` says; a conversational
    prompt offers the run's tools, whose calls run (`turns` and `calls` in each row). `max_new_tokens`
    None: the run's own budget with tools, else 64. Returns the rows and the line saying how the prompts
    were formatted."""
    from ablate.errors import ConfigError
    from ablate.models.heads import is_classifier
    from ablate.process.setup import quiet_libraries

    rows_in = [p if isinstance(p, dict) else {"prompt": p} for p in prompts]
    quiet_libraries()  # "Loading weights" bars, bitsandbytes' CPU notice: the completions are the output
    tokenizer, model = load_run_model(run_dir)  # first: "no saved model" is the news for an unfinished run
    if is_classifier(model):
        raise ConfigError(
            f"{run_dir} is a reward model (method=reward): it scores sequences and does not write; "
            "`ablate eval` on it gives its accuracy on held-out pairs"
        )
    fmt = trained_format(run_dir) if chat is None else None
    chat = bool(fmt["conversational"]) if fmt is not None else bool(chat)
    box, budget = run_toolbox(run_dir, tokenizer) if chat else (None, None)
    if max_new_tokens is None:
        max_new_tokens = (budget or TOOL_TOKENS) if box is not None else DEFAULT_TOKENS
    rows = [
        {"prompt": row["prompt"], **c}
        for row, c in zip(
            rows_in, _completions(tokenizer, model, box, rows_in, chat, max_new_tokens, temperature, seed)
        )
    ]
    for row, given in zip(rows, rows_in):
        if (want := expected(given)) is not None:
            row.update(expected=want, match=row["completion"].strip() == want.strip())
    if before:
        del model
        start_tok, start = starting_model(run_dir)
        start_box = run_toolbox(run_dir, start_tok)[0] if box is not None else None
        for row, c in zip(
            rows, _completions(start_tok, start, start_box, rows_in, chat, max_new_tokens, temperature, seed)
        ):
            row["before"] = c["completion"]
            if "turns" in c:
                row.update(
                    before_turns=c["turns"],
                    **({"before_malformed": c["malformed"]} if "malformed" in c else {}),
                )
    how = describe_format(chat, fmt)
    if box is not None:
        names = ", ".join(x["function"]["name"] for x in box.schemas)
        how += (
            f"; offering the run's tools ({names}; tool_call_format={box.format.kind}), each call run and "
            f"its result appended as in its rollouts; up to {max_new_tokens} new tokens over all turns"
        )
    return rows, how


def _completions(
    tokenizer: Any,
    model: Any,
    box: Any,
    rows: list[dict[str, Any]],
    chat: bool,
    max_new_tokens: int,
    temperature: float,
    seed: int,
) -> list[dict[str, Any]]:
    """Each row's {completion} (no tools), or {completion, turns, calls} (tools: `complete_with_tools`)."""
    if box is not None:
        return complete_with_tools(tokenizer, model, rows, box, max_new_tokens, temperature, seed)
    return [
        {"completion": c} for c in complete(tokenizer, model, rows, chat, max_new_tokens, temperature, seed)
    ]


def shown(completion: str) -> str:
    """A completion as printed: one that is empty or only whitespace says so (a blank line reads as a bug)."""
    if not completion:
        return "(empty: the model wrote no text)"
    return completion if completion.strip() else f"(only whitespace: {completion!r})"


def generate_cmd(args: Any) -> None:
    """`ablate generate RUN_DIR (--prompt P ... | --prompts FILE.jsonl) [--max-new-tokens N] [--temperature T]
    [--json] [--before] [--format plain|chat]` (arguments: ablate.cli.parser)."""
    from ablate.errors import USER_ERRORS

    with user_errors(*USER_ERRORS, ValueError, FileNotFoundError):
        args.run_dir = rundir.given_run(args.run_dir)  # `last`: the newest run
        rundir.check_given(args.run_dir, run=False)  # at once: before the heavy imports
        prompts = read_prompts(args.prompt, args.prompts)
        if not prompts:
            raise ValueError("give --prompt TEXT or --prompts FILE.jsonl")
        chat = None if args.format is None else args.format == "chat"
        rows, how = generate(
            args.run_dir, prompts, args.max_new_tokens, args.temperature, args.seed, args.before, chat
        )
    print(how, file=sys.stderr if args.json else sys.stdout)  # --json: stdout is the rows only
    if not args.json:
        print()
    for row in rows:
        prompt = row["prompt"] if isinstance(row["prompt"], str) else json.dumps(row["prompt"])
        if args.json:
            print(json.dumps(row))
        elif "turns" in row:  # a tool run: each call, its result, the answer
            before = (
                [
                    "before training:",
                    *("  " + x for x in show_turns(row["before_turns"], row.get("before_malformed"))),
                    "after training:",
                ]
                if "before_turns" in row
                else []
            )
            print(
                "\n".join(
                    [
                        f">>> {prompt}",
                        *before,
                        *(
                            ("  " if before else "") + x
                            for x in show_turns(row["turns"], row.get("malformed"))
                        ),
                    ]
                )
            )
            print()
        elif "before" in row:
            after = shown(row["completion"])
            print(f">>> {prompt}\nbefore training: {shown(row['before'])}\nafter training:  {after}\n")
        else:
            print(f">>> {prompt}\n{shown(row['completion'])}\n")
    scored = [row["match"] for row in rows if "match" in row]
    if scored:
        print(
            f"{sum(scored)}/{len(scored)} completions equal the file's `completion` (ends' whitespace aside)",
            file=sys.stderr if args.json else sys.stdout,
        )
