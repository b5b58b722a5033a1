"""The fast GRPO generator on the real 135M model: SmolLM2-135M-Instruct's chat prompts, 2 prompts x 4
completions of up to 24 tokens (ended by <|im_end|> at different steps): greedy and sampled (same seed)
completions identical to `model.generate`'s (`HFGenerator`)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_shared_prompt_generator_draws_what_generate_draws(smollm2, tmp_path, sample):
    from ablate.data.tokenize import encode_prompt
    from ablate.methods.grpo import GRPOConfig
    from ablate.rollouts.generation import HFGenerator, SharedPromptGenerator

    tok, model = smollm2
    questions = (
        "What is 9 plus 2? Answer with one word.",
        "Name a colour of the sky, and say why, in detail.",
    )
    rows = [encode_prompt(tok, [{"role": "user", "content": q}]) for q in questions for _ in range(4)]
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=24,
        temperature=0.8,
        report_to="none",
        use_cpu=True,
    )
    hf = HFGenerator(args, tok)
    if not sample:
        hf.config.do_sample, hf.config.temperature, hf.config.top_k = False, None, None
    outs = []
    for gen in (hf, SharedPromptGenerator(args, tok, do_sample=sample)):
        torch.manual_seed(0)
        outs.append((gen(model, rows), torch.rand(2).tolist()))
    assert outs[0] == outs[1]
    if sample:
        assert len({len(c) for c in outs[0][0]}) > 1  # rows ended at different steps
