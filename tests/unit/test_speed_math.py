"""ablate.speed.throughput: FLOPs per token against hand arithmetic, the peak's cache and user override, and the
callback's window arithmetic (tokens/s, MFU, GRPO's time split) on a stub trainer."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainerControl, TrainerState

from ablate.rollouts.stats import RolloutStats
from ablate.speed import throughput as speed


def tiny_llama(tie: bool = True) -> LlamaForCausalLM:
    """The docstring's model: hidden 8, intermediate 16, 2 layers, 2 heads of dim 4, 1 KV head, vocab 32."""
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=32,
            hidden_size=8,
            intermediate_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=tie,
        )
    )


@pytest.mark.parametrize("tie", [True, False])
def test_flops_per_token_is_the_docstrings_hand_arithmetic(tie: bool) -> None:
    model = tiny_llama(tie)
    # per layer q 64 + k 32 + v 32 + o 64 + gate 128 + up 128 + down 128 = 576; x2 layers + lm_head 256
    assert speed.matmul_params(model) == 2 * 576 + 256 == 1408
    assert speed.flops_per_token(model) == 6 * 1408 == 8448
    assert speed.flops_per_token(model, seq_len=10) == 8448 + 12 * 2 * (2 * 4) * 10 == 10368
    # tied or not, the embedding table is not counted, the lm_head is (both shapes are 32 x 8)
    assert sum(p.numel() for p in model.parameters()) != 1408


def test_probe_is_positive_and_short() -> None:
    flops = speed.probe("cpu", torch.float32, seconds=0.05)
    assert flops > 1e6  # any CPU does more than a MFLOP/s


def test_cache_hit_does_not_reprobe(tmp_path, monkeypatch) -> None:
    calls: list[object] = []
    monkeypatch.setattr(
        speed, "probe_on", lambda device, dtype, seconds=1.0: (calls.append(dtype) or 123e9, True)
    )
    path = tmp_path / "peak.json"
    assert speed.peak_flops("cpu", torch.float32, path=path) == 123e9
    assert speed.peak_flops("cpu", torch.float32, path=path) == 123e9
    assert calls == [torch.float32]  # the second call read the cache
    assert speed.peak_flops("cpu", torch.bfloat16, path=path) == 123e9
    assert calls == [torch.float32, torch.bfloat16]  # bf16 and fp32 are probed (and cached) separately
    keys = sorted(json.loads(path.read_text()))
    assert len(keys) == 2 and "bfloat16" in keys[0] and "float32" in keys[1]
    assert all("threads" in k and torch.__version__ in k for k in keys)


def test_user_value_wins_over_cache_and_probe(tmp_path, monkeypatch) -> None:
    path = tmp_path / "peak.json"
    monkeypatch.setattr(speed, "probe_on", lambda device, dtype, seconds=1.0: (5e9, True))
    assert speed.peak_flops("cpu", torch.float32, path=path) == 5e9
    monkeypatch.setattr(
        speed, "probe_on", lambda device, dtype, seconds=1.0: pytest.fail("probed despite a user value")
    )
    assert speed.peak_flops("cpu", torch.float32, user_tflops=0.42, path=path) == pytest.approx(0.42e12)


def test_corrupt_cache_is_probed_again(tmp_path, monkeypatch) -> None:
    path = tmp_path / "peak.json"
    path.write_text("not json")
    monkeypatch.setattr(speed, "probe_on", lambda device, dtype, seconds=1.0: (7e9, True))
    assert speed.peak_flops("cpu", torch.float32, path=path) == 7e9
    assert list(json.loads(path.read_text()).values()) == [{"flops": 7e9, "idle": True, "probes": 1}]


def test_a_peak_probed_on_a_busy_machine_is_probed_again_and_the_best_kept(tmp_path, monkeypatch) -> None:
    """Issue 37: the measured peak moved 198 -> 109 -> 95 GFLOP/s with the machine's load, so MFU did
    not compare between runs. A busy probe is taken again by the next runs and the best kept, until one
    runs idle (then final) or BUSY_PROBES were taken; the note says which."""
    path = tmp_path / "peak.json"
    probes = iter([(60e9, False), (95e9, False), (80e9, False), (200e9, True)])
    monkeypatch.setattr(speed, "probe_on", lambda device, dtype, seconds=1.0: next(probes))
    assert speed.peak_flops("cpu", torch.float32, path=path) == 60e9
    assert "the best of 1 probe(s) on a busy CPU, so far: MFU may read high" in speed.peak_note(
        "cpu", torch.float32, path=path
    )
    assert speed.peak_flops("cpu", torch.float32, path=path) == 95e9  # probed again, higher: kept
    assert speed.peak_flops("cpu", torch.float32, path=path) == 95e9  # probed again, lower: the best stays
    assert speed.peak_note("cpu", torch.float32, path=path).startswith(
        "the best of 3 probes, all on a busy CPU"
    )
    assert speed.peak_flops("cpu", torch.float32, path=path) == 95e9  # settled after 3: not probed again
    path.unlink()
    probes = iter([(60e9, False), (200e9, True)])
    assert speed.peak_flops("cpu", torch.float32, path=path) == 60e9
    assert speed.peak_flops("cpu", torch.float32, path=path) == 200e9  # an idle probe: final
    assert speed.peak_note("cpu", torch.float32, path=path).startswith("measured on an idle machine")
    assert (
        speed.peak_flops("cpu", torch.float32, path=path) == 200e9
    )  # not probed again (the iterator is spent)
    old = {speed.device_key("cpu", torch.float32): 123e9}  # an older ablate's bare number: final, as it was
    path.write_text(json.dumps(old))
    assert speed.peak_flops("cpu", torch.float32, path=path) == 123e9


def test_probe_on_sees_another_process_on_the_cpu() -> None:
    """A process spinning on a core during the probe: the probe was not taken on an idle machine."""
    import multiprocessing

    stop = multiprocessing.Event()
    spinner = multiprocessing.Process(target=_spin, args=(stop,))
    spinner.start()
    try:
        time.sleep(0.2)
        _, idle = speed.probe_on("cpu", torch.float32, seconds=0.5)
    finally:
        stop.set()
        spinner.join()
    assert idle is False


def _spin(stop) -> None:
    while not stop.is_set():
        pass


def test_callback_window_arithmetic(monkeypatch) -> None:
    """Two windows of a GRPO-like trainer: tokens/s and MFU from the counters' deltas over the steps' time;
    eval/save time between steps is not counted."""
    clock = iter([0.0, 2.0, 4.0, 100.0, 101.0, 105.0]).__next__
    monkeypatch.setattr(speed.time, "perf_counter", clock)
    model = tiny_llama()
    rollouts = RolloutStats()  # the trainer's declared counters (ablate.rollouts.stats.ReportsRollouts)
    trainer = SimpleNamespace(
        model=model,
        accelerator=SimpleNamespace(unwrap_model=lambda m: m),
        callback_handler=SimpleNamespace(callbacks=[]),
        rollout_stats=lambda: rollouts,
    )
    cb = speed.ThroughputCallback(trainer, peak_tflops=1e-6)  # 1 MFLOP/s
    args = SimpleNamespace(world_size=1, device="cpu", bf16=False, fp16=False)
    state, control = TrainerState(), TrainerControl()
    cb.on_train_begin(args, state, control)  # t=0
    state.global_step, state.num_input_tokens_seen = 1, 100
    cb.on_step_end(args, state, control)  # t=2
    state.global_step, state.num_input_tokens_seen = 2, 300
    rollouts.generated_tokens, rollouts.generation_seconds, rollouts.scoring_seconds = 50, 1.0, 0.5
    cb.on_step_end(args, state, control)  # t=4: 4 s, 300 tokens, 50 generated, 2 steps
    logs = {"loss": 1.0}
    cb.on_log(args, state, control, logs=logs)
    assert logs["tokens_per_second"] == pytest.approx(300 / 4)
    assert logs["mfu"] == pytest.approx((8448 * 300 + 8448 / 3 * 50) / 4 / 1e6)
    assert logs["num_input_tokens_seen"] == 300  # added where Trainer does not log it (GRPO)
    assert (logs["time/generation"], logs["time/scoring"], logs["time/training"]) == pytest.approx(
        (0.5, 0.25, 1.25)
    )
    cb.on_save(args, state, control)  # t=100: a checkpoint took 96 s
    state.global_step, state.num_input_tokens_seen = 3, 400
    cb.on_step_end(args, state, control)  # t=101
    logs = {"loss": 1.0}
    cb.on_log(args, state, control, logs=logs)
    assert logs["tokens_per_second"] == pytest.approx(100 / 1)  # the save's 96 s are no step's
    eval_logs = {"eval_loss": 1.0}
    cb.on_log(args, state, control, logs=eval_logs)
    assert "tokens_per_second" not in eval_logs
    assert cb.summary_fields() == {
        "tokens_per_second": pytest.approx(80.0),
        "peak_tflops": 1e-6,
        "peak_source": "peak_tflops",
        "mfu": pytest.approx((8448 * 400 + 8448 / 3 * 50) / 5 / 1e6, rel=1e-5),
    }


def test_probe_leaves_the_global_rng_alone() -> None:
    """A cache miss probes inside a seeded run: its draws must not shift the run's."""
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    speed.probe("cpu", torch.float32, seconds=0.01)
    assert torch.equal(torch.rand(3), expected)
