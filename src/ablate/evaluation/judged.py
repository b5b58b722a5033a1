"""`eval=judge`: a judged pairwise win rate against a baseline model, for every method.

The run's model and the baseline (`vs`: a run dir, `last`, or a save_pretrained dir; null: the run's starting
model, `model.*` of its config) each answer the data's held-out prompts (its train split when it has none),
with the same sampling (`samples` 0: one greedy answer each; N: N sampled at `temperature`, the same seed for
both models), `max_new_tokens` each. The judge (the group `judge`: ablate.evaluation.judges) scores every
answer; answer k of the run beats answer k of the baseline on the same prompt when its score is higher (a tie
counts half). eval.json gets the win rate, the length-controlled win rate (AlpacaEval 2's: a logistic
regression of the win on the length difference, read at equal length; ablate.evaluation.winrate), the mean
score difference, the mean scores and lengths; eval_examples.jsonl one row per prompt (its win rate and score
difference over its answers, both models' first answers and scores), which `ablate compare` pairs across runs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablate.errors import ConfigError
from ablate.evaluation.base import Evaluand, Result
from ablate.evaluation.winrate import summary, wins
from ablate.schema.evaluation import JudgeEval as E

JUDGES = "judge=reward_model judge.path=DIR (a method=reward run) or judge=reward_funcs (the data's)"


@dataclass
class Sampling:
    """What the generator reads (ablate.rollouts.generation.SamplingArgs), plus the judge's reward weights."""

    temperature: float
    max_completion_length: int
    top_p: float = 1.0
    top_k: int = 0
    max_prompt_length: int | None = None
    reward_weights: list[float] | None = None


class Judged:
    """The run's answers against the baseline's, scored by the judge; see the module docstring."""

    name = "judge"

    def __init__(
        self,
        vs: str | None = E.vs,
        samples: int = E.samples,
        temperature: float = E.temperature,
        max_new_tokens: int = E.max_new_tokens,
        limit: int | None = E.limit,
    ) -> None:
        self.vs, self.samples, self.temperature = vs, samples, temperature
        self.max_new_tokens, self.limit = max_new_tokens, limit

    def check(self, cfg: Any) -> None:
        """A judge is chosen and can be built (a reward model's path holds one), and the baseline exists."""
        from hydra.utils import instantiate

        if cfg.get("judge") is None:
            raise ConfigError(f"eval=judge needs a judge: {JUDGES}")
        try:
            instantiate(cfg.judge)
        except Exception as e:  # Hydra wraps the judge's own one line
            if isinstance(e.__cause__, ConfigError):
                raise ConfigError(str(e.__cause__)) from None
            raise
        if self.vs is not None:
            baseline_dir(self.vs)

    def __call__(self, run: Evaluand) -> Result:
        import torch
        from hydra.utils import instantiate

        from ablate.rollouts.evaluate import scored_completions

        cfg = run.cfg
        judge = instantiate(cfg.judge)
        data = instantiate(cfg.data)
        dataset = data.eval if data.eval is not None else data.train
        if self.limit is not None:
            dataset = dataset.select(range(min(self.limit, len(dataset))))
        funcs, weights = judge.funcs(data, cfg.method.get("args"))
        sampling = Sampling(self.temperature, self.max_new_tokens, reward_weights=weights)
        tokenizer, baseline = self.baseline(cfg)
        answers = []
        for model, tok in ((run.model, run.tokenizer), (baseline, tokenizer)):
            torch.manual_seed(int(cfg.seed))  # the same draws for both models
            answers.append(scored_completions(model, tok, dataset, funcs, sampling, self.samples, 16))
        del baseline
        ours, theirs = answers
        metrics = summary(ours.total.tolist(), theirs.total.tolist(), ours.lengths, theirs.lengths)
        facts = {
            "vs": self.vs or f"the starting model ({cfg.model.get('path') or cfg.model.get('_target_')})",
            "judge": getattr(judge, "name", type(judge).__name__),
            "prompts": len(dataset),
            "answers": f"{self.samples} sampled per prompt" if self.samples else "greedy, one per prompt",
        }
        return Result(metrics, rows(ours, theirs), facts)

    def baseline(self, cfg: Any) -> tuple[Any, Any]:
        """(tokenizer, model) of the baseline: `vs`'s model dir, else the run's starting model."""
        from hydra.utils import instantiate

        from ablate.models import pretrained

        if self.vs is None:
            return instantiate(cfg.model)
        return pretrained(str(baseline_dir(self.vs)))


def baseline_dir(vs: str) -> Path:
    """The save_pretrained dir `vs` names: itself, or a run dir's model/ (`last`: the newest run)."""
    path = Path(vs).expanduser()
    for candidate in (path, path / "model"):
        if (candidate / "config.json").is_file() or (candidate / "adapter_config.json").is_file():
            return candidate
    raise ConfigError(
        f"eval.judge.vs={vs}: no model there (neither it nor {path / 'model'} holds config.json or an "
        "adapter); give a run dir, `last`, or a save_pretrained dir"
    )


def rows(ours: Any, theirs: Any) -> list[dict[str, Any]]:
    """One row per prompt: its win rate and mean score difference over its answers (the per-example scores
    `ablate compare` pairs), and both models' first answers with their scores (W&B's table)."""
    n, out = ours.n, []
    won = wins(ours.total.tolist(), theirs.total.tolist())
    for i in range(len(ours.texts) // n):
        at = slice(i * n, (i + 1) * n)
        prompt = ours.prompts[i * n]
        out.append(
            {
                "id": "judge/"
                + hashlib.sha1(f"{i}:{prompt}".encode()).hexdigest()[:16],  # a prompt may repeat
                "judge/win_rate": sum(won[at]) / n,
                "judge/score_diff": float((ours.total[at] - theirs.total[at]).mean()),
                "prompt": prompt,
                "completion": ours.texts[i * n],
                "baseline": theirs.texts[i * n],
                "score": float(ours.total[i * n]),
                "baseline_score": float(theirs.total[i * n]),
            }
        )
    return out
