"""`method.args`: the TrainingArguments fields every method's YAML sets (conf/training_args.yaml), and
DPO's and SFT's own. Defaults are TrainingArguments' and TRL 1.16's (a method's config class inherits
them: tests/unit/test_schema.py pins them to TrainingArguments'); any other TrainingArguments field
is checked by TrainingArguments itself."""

from __future__ import annotations

from dataclasses import dataclass

from ablate.schema import BOOL, Rule, Schema, choice, field, integer, is_num, nullable, number

STEPS = Rule(lambda v, n: is_num(v) and v > 0, "a number > 0")


@dataclass
class TrainArgs(Schema):
    node = "method.args"
    per_device_train_batch_size: int = field(8, integer(1), "Examples per micro-batch per device.")
    per_device_eval_batch_size: int = field(8, integer(1), "Examples per eval forward.")
    gradient_accumulation_steps: int = field(1, integer(1), "Micro-batches per optimizer step.")
    num_train_epochs: float = field(
        3.0, number(above=0), "Passes over the train split (when max_steps is -1)."
    )
    # 0 is not "no training": Trainer runs one step
    max_steps: int = field(
        -1,
        Rule(lambda v, n: v == -1 or integer(1).test(v, n), "-1 (use num_train_epochs) or an integer >= 1"),
        "Optimizer steps; -1: epochs.",
    )
    max_grad_norm: float | None = field(
        1.0, nullable(number(at_least=0, why=" (0 = no clipping)")), "Gradient clipping."
    )
    logging_steps: float = field(500, STEPS, "Steps between log events.")
    eval_strategy: str = field("no", choice("no", "steps", "epoch"), "When to evaluate.")
    eval_steps: float | None = field(None, nullable(STEPS), "Steps between evals (null: logging_steps).")
    save_strategy: str = field("steps", choice("no", "steps", "epoch", "best"), "When to checkpoint.")
    save_steps: float = field(
        500,
        Rule(STEPS.test, "a number > 0 (turn checkpoints off with method.args.save_strategy=no)"),
        "Steps between checkpoints.",
    )
    save_total_limit: int | None = field(None, nullable(integer(1)), "Checkpoints kept (null: all).")
    dataloader_num_workers: int = field(0, integer(0), "Dataloader worker processes.")
    use_cpu: bool = field(False, BOOL, "Train on the CPU even when a GPU is visible.")
    disable_tqdm: bool | None = field(None, nullable(BOOL, "by the log level"), "No progress bar.")


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
