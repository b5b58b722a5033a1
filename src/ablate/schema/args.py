"""`method.args`: the TrainingArguments fields ablate sets, and the own fields of the methods that score the
rows they are given: DPO (and ORPO, CPO, SimPO), SFT, reward modelling, KTO. Each field is
declared here once: its default (ablate's, the same from the command line and from Python; where it
differs from TrainingArguments' or TRL 1.16's, its help says), its type, its one-line help and its
check. Hydra composes `method.args` from these classes (ablate.config.compose; conf/method/dpo.yaml:
`- /schema@args: DPOArgs`); any other TrainingArguments field is added with `+method.args.<field>=...`
and checked by TrainingArguments."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ablate.schema import (
    BOOL,
    Problem,
    Rule,
    Schema,
    choice,
    field,
    integer,
    is_int,
    is_num,
    nullable,
    number,
)

STEPS = Rule(lambda v, n: is_num(v) and v > 0, "a number > 0")
# 0 is not "no training": Trainer runs one step
MAX_STEPS = Rule(
    lambda v, n: v == -1 or integer(1).test(v, n), "-1 (use num_train_epochs) or an integer >= 1"
)
TOKENS_SEEN = choice("no", "all", "non_padding")


@dataclass
class TrainArgs(Schema):
    node = "method.args"
    # Hydra builds the node's lists and `_target_` nodes (GRPO's tools) before the class sees them, or not
    recursive: ClassVar[bool] = True
    per_device_train_batch_size: int = field(
        8, integer(1), "Examples (pairs, prompts) per micro-batch per device."
    )
    per_device_eval_batch_size: int = field(
        16, integer(1), "Examples per eval forward (TrainingArguments: 8)."
    )
    gradient_accumulation_steps: int = field(1, integer(1), "Micro-batches per optimizer step.")
    num_train_epochs: float = field(
        1.0, number(above=0), "Passes over the train split when max_steps is -1 (TrainingArguments: 3)."
    )
    max_steps: int = field(
        60,
        MAX_STEPS,
        "Optimizer steps; -1: num_train_epochs (TrainingArguments: -1; 60 trains the tiny defaults).",
    )
    max_grad_norm: float | None = field(
        1.0, nullable(number(at_least=0, why=" (0 = no clipping)")), "Gradient clipping."
    )
    logging_steps: float = field(
        5, STEPS, "Steps between log events: metrics.jsonl, W&B, progress (TrainingArguments: 500)."
    )
    eval_strategy: str = field("no", choice("no", "steps", "epoch"), "When to evaluate.")
    eval_steps: float | None = field(None, nullable(STEPS), "Steps between evals (null: logging_steps).")
    save_strategy: str = field(
        "steps", choice("no", "steps", "epoch", "best"), "When to checkpoint (resume starts from the newest)."
    )
    save_steps: float = field(
        50,
        Rule(STEPS.test, "a number > 0 (turn checkpoints off with method.args.save_strategy=no)"),
        "Steps between checkpoints (TrainingArguments: 500).",
    )
    save_total_limit: int | None = field(
        2, nullable(integer(1)), "Checkpoints kept, the newest (null: all, TrainingArguments' default)."
    )
    dataloader_num_workers: int = field(
        0, integer(0), "Dataloader worker processes (tiny data: they cost more than they save)."
    )
    use_cpu: bool = field(False, BOOL, "Train on the CPU even when a GPU is visible.")
    disable_tqdm: bool | None = field(
        False,
        nullable(BOOL, "by the log level"),
        "No progress bar (TrainingArguments: null, by the log level).",
    )
    include_num_input_tokens_seen: str = field(
        "non_padding",
        TOKENS_SEEN,
        "Log num_input_tokens_seen: non_padding = real tokens (compare --x tokens); TrainingArguments: no.",
    )
    report_to: Any = field(
        "none",
        Rule(
            lambda v, n: isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
            "none, an integration's name or a list of them",
        ),
        "Trainer's own integrations: none, as ablate's logger group tracks runs (TrainingArguments: all).",
    )
    eval_on_start: bool = field(False, BOOL, "Evaluate before the first step (the curve's starting point).")
    gradient_checkpointing: bool | None = field(
        None,
        nullable(BOOL),
        "Recompute activations in the backward pass: less memory, ~30% more compute; null: off.",
    )


LENGTH = nullable(integer(1))  # tokens; null: no limit


@dataclass
class DPOArgs(TrainArgs):
    targets = ("ablate.methods.dpo_config.DPOConfig",)
    # the implicit reward's scale: 0 makes the loss constant (hinge divides by it)
    beta: float = field(0.1, number(above=0), "KL strength: scales the implicit reward beta * log(pi / ref).")
    max_length: int | None = field(
        512, LENGTH, "Keep the first N tokens of prompt+completion; drop pairs whose prompt fills it (TRL)."
    )
    max_prompt_length: int | None = field(
        None, LENGTH, "Keep the last N prompt tokens first (not in TRL 1.16)."
    )
    max_completion_length: int | None = field(None, LENGTH, "Keep the first N tokens of each completion.")
    precompute_ref_log_probs: bool = field(
        True, BOOL, "Score the data with the initial policy once, before training."
    )


@dataclass
class SFTArgs(TrainArgs):
    targets = ("ablate.methods.sft.SFTConfig",)
    max_length: int | None = field(
        512, LENGTH, "Keep the first N tokens of prompt+completion; drop rows left without loss tokens."
    )
    completion_only_loss: bool | None = field(
        None,
        nullable(BOOL, "by the rows' format"),
        "Loss on the completion only; null: yes for prompt-completion rows (TRL).",
    )
    assistant_only_loss: bool = field(
        False,
        BOOL,
        "Conversational rows: loss on the assistant turns only (the chat "
        "template's {% generation %} markers, else by rendering prefixes).",
    )


@dataclass
class RewardArgs(TrainArgs):
    targets = ("ablate.methods.reward.RewardConfig",)
    max_length: int | None = field(
        1024, LENGTH, "Drop pairs whose chosen or rejected sequence is longer (TRL's filter)."
    )
    center_rewards_coefficient: float | None = field(
        None,
        nullable(number(at_least=0), "off"),
        "Weight of the mean-zero penalty (r_c + r_r)^2 (Eisenstein et al. 2023); null = off.",
    )


@dataclass
class KTOArgs(TrainArgs):
    targets = ("ablate.methods.kto.KTOConfig",)
    beta: float = field(0.1, number(above=0), "Scales the implicit reward b * log(pi/ref).")
    desirable_weight: float = field(
        1.0,
        number(above=0, why=" (a weight of its examples' losses)"),
        "Weight of desirable examples' losses.",
    )
    undesirable_weight: float = field(
        1.0,
        number(above=0, why=" (a weight of its examples' losses)"),
        "Weight of undesirable examples' losses.",
    )
    max_length: int | None = field(
        1024, LENGTH, "Keep the first N tokens of prompt+completion; drop examples whose prompt fills it."
    )
    precompute_ref_log_probs: bool = field(
        True, BOOL, "Score the data with the initial policy once, before training."
    )
    # TRL's: the KL pairs are fixed within each batch of the data's order
    train_sampling_strategy: str = field(
        "sequential",
        choice("sequential", words="sequential (the KL pairs are fixed in the data's order, as in TRL)"),
        "The data's order (KTO's KL pairs depend on it).",
    )

    def relations(self, cfg: Mapping[str, Any]) -> Iterator[Problem]:
        loss = str(((cfg.get("method") or {}).get("kto_loss") or {}).get("_target_", ""))
        problem = kl_batch_problem(self.per_device_train_batch_size, not loss.endswith("apo_zero_unpaired"))
        if problem is not None:
            yield problem


def kl_batch_problem(batch: Any, uses_kl: bool) -> Problem | None:
    """KTO's KL estimate pairs each example with another's completion within a batch: a batch of two at least.
    Checked against the config's loss (method/kto_loss) when the config is, and by the trainer against its
    own."""
    if not uses_kl or not is_int(batch) or batch >= 2:
        return None
    return (
        "method.args.per_device_train_batch_size",
        batch,
        "an integer >= 2 (KTO's KL estimate pairs each "
        "example with another's output; method/kto_loss=apo_zero_unpaired needs none)",
    )
