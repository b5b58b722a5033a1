"""benchmarks/harness.py: alternation, the table's arithmetic (on children with known numbers), and the
child side (StepRecorder + report) on a real 2-step Trainer run. No timing is asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from tiny_setups import grpo_config, numbered_prompts

sys.path.insert(0, str(ROOT / "benchmarks"))
import harness  # noqa: E402

FAKE_CHILD = """
import json, sys
name, log = sys.argv[1], sys.argv[2]
open(log, "a").write(name + "\\n")
loss = {"a": [1.0, 0.5, 0.25], "b": [1.0, 0.5, 0.26]}[name]
step = {"a": [9.0, 1.0, 1.0], "b": [9.0, 2.0, 2.0]}[name]
print("noise before the result")
print(json.dumps({"step_seconds": step, "losses": loss, "tokens": 300 if name == "a" else 0, "generated_tokens": 30,
                  "flops_per_token": 6.0, "peak_flops": 1000.0, "peak_rss_mb": 10.0 if name == "a" else 20.0,
                  "computed": {"tokens": 600, "head_rows": 30}, "head_params": 0.25}))
"""


def test_alternates_and_tabulates(tmp_path: Path) -> None:
    child, log = tmp_path / "child.py", tmp_path / "order.txt"
    child.write_text(FAKE_CHILD)
    results = harness.run_alternately(
        {n: [sys.executable, str(child), n, str(log)] for n in ("a", "b")}, repeats=2
    )
    assert log.read_text().split() == ["a", "b", "a", "b"]
    assert all(r["process_seconds"] > 0 for runs in results.values() for r in runs)
    assert all(r["steal"] is None or 0 <= r["steal"] <= 1 for runs in results.values() for r in runs)
    a, b = harness.summarize(results)
    assert (a["s_per_step"], b["s_per_step"]) == (1.0, 2.0)  # each run's first (warm-up) step left out
    assert a["tokens_per_s"] == 100.0 and a["tokens_counted"]  # 300 tokens / 3 steps / 1 s
    assert b["tokens_per_s"] == 50.0 and not b["tokens_counted"]  # b counts none: a's 100 per step, at 2 s
    assert a["mfu"] == pytest.approx(
        (6 * 100 + 2 * 10) / 1.0 / 1000
    )  # 6N per trained, 2N per generated token
    assert b["mfu"] == pytest.approx((6 * 100 + 2 * 10) / 2.0 / 1000)
    # hardware: N = 1 (0.75 body + 0.25 head); per step 600/3 = 200 positions, 10 head rows:
    # 6 * (0.75 * 200 + 0.25 * 10) = 915 FLOPs per step
    assert a["hw_mfu"] == pytest.approx(915 / 1.0 / 1000) and b["hw_mfu"] == pytest.approx(915 / 2.0 / 1000)
    assert a["max_loss_diff"] == 0.0 and b["max_loss_diff"] == pytest.approx(0.01)
    assert b["peak_rss_mb"] == 20.0
    text = harness.format_table("title", [a, b])
    assert text.splitlines()[0] == "title" and "62.0%" in text and "31.0%" in text and "1.00e-02" in text
    assert "91.5%" in text and "45.8%" in text
    assert "50*" in text and "counted by another implementation" in text


def test_steal_is_the_stolen_share_of_the_ticks_between_readings() -> None:
    """(steal, total) ticks (100, 1000) then (130, 1100): 30 of the 100 ticks between them were stolen;
    no readings or no ticks between them: unknown."""
    assert harness.steal_fraction((100, 1000), (130, 1100)) == pytest.approx(0.3)
    assert harness.steal_fraction(None, (130, 1100)) is None
    assert harness.steal_fraction((100, 1000), (100, 1000)) is None
    ticks = harness.cpu_ticks()
    if ticks is not None:  # Linux: steal is one of the fields the total sums
        assert 0 <= ticks[0] <= ticks[1]


def test_child_side_on_a_real_trainer(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    from ablate.data import packaged
    from ablate.methods.sft import SFTConfig, SFTTrainer
    from ablate.models import tiny

    from ablate.speed import head

    monkeypatch.setattr(head, "HeadLogps", head.HeadLogps)  # restored after (watch wraps it)
    tok, model = tiny()
    rec = harness.StepRecorder()
    rec.watch(model)
    args = SFTConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        logging_steps=1,
        per_device_train_batch_size=4,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        include_num_input_tokens_seen="non_padding",
    )
    SFTTrainer(
        model=model,
        args=args,
        train_dataset=packaged("sort_sft", with_eval=False).train,
        processing_class=tok,
        callbacks=[rec],
    ).train()
    out = harness.report(rec, model, args)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == out
    assert len(out["step_seconds"]) == len(out["losses"]) == len(out["grad_norms"]) == 2 and out["tokens"] > 0
    assert out["rewards"] == [] and all(g > 0 for g in out["grad_norms"])  # SFT logs no reward
    assert out["flops_per_token"] > 0 and out["peak_flops"] > 0 and "float32" in out["device"]
    # training forwards only: 2 steps of 4 padded rows, through the head from the first position that
    # scores a completion token (SFT's logits_to_keep), at least every scored one
    assert (
        out["computed"]["tokens"] >= out["computed"]["head_rows"] > 0
        and out["computed"]["tokens"] >= out["tokens"]
    )
    assert out["head_params"] == model.get_output_embeddings().weight.numel()


import grpo_vs_trl  # noqa: E402  (benchmarks/grpo_vs_trl.py: its parent side needs no torch)


def _grpo_child(
    impl: str,
    losses: list[float],
    cpu: float,
    wall: float,
    trl: bool = False,
    rewards: tuple[float, ...] = (0.1, 0.2, 0.3),
    grad_norms: tuple[float, ...] = (2.0, 1.0, 0.5),
) -> dict:
    """A GRPO child's JSON as grpo_vs_trl.run_one reports it: harness.report's fields + its extras."""
    return {
        "step_seconds": [5.0, wall, wall],
        "losses": losses,
        "rewards": list(rewards),
        "grad_norms": list(grad_norms),
        "tokens": 0 if trl else 600,
        "generated_tokens": 90,
        "flops_per_token": 6.0,
        "peak_flops": 1000.0,
        "peak_rss_mb": 100.0,
        "computed": {"tokens": 300, "head_rows": 90},
        "head_params": 0.5,
        "device": "cpu|float32",
        "process_seconds": 20.0,
        "impl": impl,
        "spg": 1,
        "seed": 0,
        "wall_per_step": wall,
        "cpu_per_step": cpu,
        "generation": cpu / 4,
        "scoring": cpu / 4,
        "training": cpu / 2,
    }


def test_grpo_children_tabulate(capsys) -> None:
    results = {
        "ablate": [_grpo_child("ablate", [0.1, 0.2, 0.3], cpu=2.0, wall=2.0)],
        "ablate:noshare": [_grpo_child("ablate:noshare", [0.1, 0.2, 0.3], cpu=3.0, wall=4.0)],
        "trl": [
            _grpo_child(
                "trl",
                [0.1, 0.5, 0.3],
                cpu=6.0,
                wall=8.0,
                trl=True,
                rewards=(0.1, 0.25, 0.3),
                grad_norms=(2.0, 1.5, 0.5),
            )
        ],
    }
    base, noshare, trl = harness.summarize(results)
    # 600 tokens / 3 steps = 200 per step trained (6N), 30 generated (2N): (1200 + 60) / 2 s / 1000
    assert base["mfu"] == pytest.approx(1260 / 2.0 / 1000) and trl["mfu"] == pytest.approx(1260 / 8.0 / 1000)
    assert not trl["tokens_counted"] and trl["tokens_per_s"] == 25.0  # ablate's count, at trl's 8 s/step
    assert base["hw_mfu"] == pytest.approx(6 * (0.5 * 100 + 0.5 * 30) / 2.0 / 1000)
    assert noshare["max_loss_diff"] == 0.0 and trl["max_loss_diff"] == pytest.approx(0.3)  # against the first
    # per step, against the first: the reward's largest difference, the gradient norm's largest relative one
    assert noshare["max_reward_diff"] == 0.0 and trl["max_reward_diff"] == pytest.approx(0.05)
    assert noshare["max_grad_norm_rel"] == 0.0 and trl["max_grad_norm_rel"] == pytest.approx(
        0.5
    )  # |1.5 - 1| / 1
    harness.print_table("GRPO spg 1", results)
    out = capsys.readouterr().out
    assert "(base)" in out and "3.00e-01" in out and "HW MFU" in out and "device: cpu|float32" in out
    header, trl_line = out.splitlines()[1], next(line for line in out.splitlines() if line.startswith("trl "))
    assert "max |dreward|" in header and "grad-norm rel" in header
    assert trl_line.split()[-3:] == ["3.00e-01", "5.00e-02", "5.00e-01"]
    without = [
        {k: v for k, v in r.items() if k not in ("rewards", "grad_norms")}
        for r in (results["ablate"][0], results["trl"][0])
    ]
    rows = harness.summarize(
        {"a": [without[0]], "trl": [without[1]]}
    )  # DPO/SFT logs no reward: no such column
    assert rows[1]["max_reward_diff"] is None and "dreward" not in harness.format_table("t", rows)
    table = grpo_vs_trl.cpu_table(results, spg=1).splitlines()
    assert "vs trl" in table[0] and len(table) == 4
    assert table[1].split()[:6] == ["ablate", "1", "2.00", "0.50", "0.50", "1.00"]
    assert "3.00x" in table[1] and "4.00x" in table[1]  # trl 6 CPU s / 2, 8 wall s / 2
    assert "1.00x" in table[3]
    assert "nan" in grpo_vs_trl.cpu_table({"ablate": results["ablate"]}, spg=1)  # no trl side: no ratio


def test_grpo_timed_counts_completions() -> None:
    class T:
        def trl_generate(self, n: int) -> tuple[list[list[int]], None]:  # TRL: (completion_ids, logprobs)
            return [[1] * n, [2] * (n + 1)], None

    t, box = T(), {"generation": 0.0, "generation_cpu": 0.0, "generated_tokens": 0}
    grpo_vs_trl._timed(
        t, "trl_generate", box, "generation", lambda out: grpo_vs_trl.completion_tokens(out[0])
    )
    assert t.trl_generate(3)[0] == [[1, 1, 1], [2, 2, 2, 2]]
    t.trl_generate(1)
    assert box["generated_tokens"] == 7 + 3 and box["generation"] > 0


def test_grpo_hw_count_is_training_forwards_only(tmp_path: Path, monkeypatch) -> None:
    """ablate's GRPO with its default sampler and spg 2 (so pi_old is scored too): the watched counts
    exclude generation and no-grad scoring; the head (ablate's fused one) projects each sampled token
    once per step."""
    import torch

    from ablate.speed import head

    monkeypatch.setattr(head, "HeadLogps", head.HeadLogps)  # restored after (watch wraps it)

    from ablate.methods.grpo import GRPOTrainer
    from ablate.models import tiny

    tok, model = tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    rec = harness.StepRecorder()
    rec.watch(model)
    every = {"tokens": 0}  # all forwards, grad or not
    model.get_input_embeddings().register_forward_pre_hook(
        lambda m, inputs: every.__setitem__("tokens", every["tokens"] + inputs[0].numel())
    )
    trainer = GRPOTrainer(
        model=model,
        args=grpo_config(tmp_path, steps_per_generation=2, max_steps=2),
        train_dataset=numbered_prompts(8),
        processing_class=tok,
        reward_funcs={"len": lambda completions, **_: [float(len(c)) for c in completions]},
        callbacks=[rec],
    )
    box = {"generation": 0.0, "generation_cpu": 0.0, "generated_tokens": 0}
    gen = trainer.generator
    trainer.generator = lambda m, p: gen(m, p)
    grpo_vs_trl._timed(trainer, "generator", box, "generation", grpo_vs_trl.completion_tokens)
    trainer.train()
    assert box["generated_tokens"] > 0 and torch.is_grad_enabled()
    assert (
        rec.computed["head_rows"] == box["generated_tokens"]
    )  # one round of 8 completions, trained over 2 steps
    assert 0 < rec.computed["tokens"] < every["tokens"]  # generation and pi_old's scoring left out
    assert len(rec.losses) == 2
    # the reward: rewards/len/mean, logged by the step that generated (one round of two steps), as TRL logs it
    assert len(rec.rewards) == 1 and rec.rewards[0] > 0


def test_seeded_generation_draws_the_same_samples_whatever_ran_between() -> None:
    """`_seeded`: round k samples from torch's RNG seeded with seed + k, so what a trainer draws from the global RNG
    between rounds (TRL's shuffle of its generation batch) does not move the next round's samples."""
    import torch

    class G:
        def sample(self) -> list[float]:
            return torch.rand(3).tolist()

    a, b = G(), G()
    grpo_vs_trl._seeded(a, "sample", 7)
    grpo_vs_trl._seeded(b, "sample", 7)
    first = a.sample()
    assert b.sample() == first
    torch.rand(5)  # one side draws something between its rounds, the other does not
    second = a.sample()
    assert b.sample() == second != first  # round 2: seed 8, the same on both sides


def test_trl_fused_head_rows_counted_with_grad_only(monkeypatch) -> None:
    """TRL's fused LM head never calls the head module: `watch` alone would count 0 head rows."""
    import torch
    from trl.trainer import utils
    from trl.trainer.utils import add_fused_lm_head

    monkeypatch.setattr(utils, "_ChunkedLogProbFunction", utils._ChunkedLogProbFunction)  # restored after

    from ablate.models import tiny

    tok, model = tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    rec = harness.StepRecorder()
    rec.watch(model)
    rec.watch_trl_fused_head()
    add_fused_lm_head(model)
    ids = torch.randint(0, 100, (3, 5))
    labels = ids.clone()
    labels[:, :2] = -100  # a prompt: not scored, but on CPU TRL projects it anyway
    out = model(input_ids=ids, labels=labels, fused_lm_head=True)
    out.loss.backward()
    assert rec.computed == {"tokens": 15, "head_rows": 3 * 4}  # every shifted position of every row
    with torch.no_grad():
        model(input_ids=ids, labels=labels, fused_lm_head=True)
    assert rec.computed == {"tokens": 15, "head_rows": 12}


def test_grpo_step_seconds_are_round_means() -> None:
    # spg 2: steps 1 and 3 generate (slow), 2 and 4 only train; a partial last round is its own mean
    assert grpo_vs_trl.round_means([5.0, 1.0, 3.0, 1.0, 4.0], spg=2) == [3.0, 3.0, 2.0, 2.0, 4.0]
    assert grpo_vs_trl.round_means([5.0, 1.0], spg=1) == [5.0, 1.0]


def test_record_writes_this_cpu_familys_verdicts(tmp_path, monkeypatch) -> None:
    """--record: each path's CPU speedup (the side without it over the side with it) and exactness go into this
    CPU family's record, the family's other paths and the other families kept."""
    from ablate.speed import measured

    record = tmp_path / "measured.json"
    other = {"family": {"arch": "x86_64", "vendor": "AuthenticAMD"}, "run": "amd", "paths": {}}
    mine = {
        "family": measured.cpu_family(),
        "run": "old",
        "paths": {"lean_layers": {"on": True, "exact": True, "speedup": 1.1, "basis": "b"}},
    }
    record.write_text(json.dumps({"cpu": {"families": [other, mine]}}))
    monkeypatch.setattr(measured, "RECORD", record)
    results = {
        "ablate": [_grpo_child("ablate", [0.1, 0.2, 0.3], cpu=2.0, wall=2.0)],
        "ablate:noshare": [_grpo_child("ablate:noshare", [0.1, 0.2, 0.3], cpu=3.0, wall=4.0)],
        "ablate:hf": [_grpo_child("ablate:hf", [0.1, 0.2, 0.4], cpu=1.0, wall=1.0)],
    }
    out = harness.record_cpu(
        results,
        {"grpo_group_rows": ("ablate:noshare", "ablate"), "shared_prefill": ("ablate:hf", "ablate")},
        lambda runs: runs[0]["cpu_per_step"],
        "GRPO test",
        str(record),
    )
    assert "grpo_group_rows          1.50x" in out
    rows = json.loads(record.read_text())["cpu"]["families"]
    assert rows[0] == other and rows[1]["family"] == measured.cpu_family()
    paths = rows[1]["paths"]
    assert paths["grpo_group_rows"]["on"] and paths["grpo_group_rows"]["speedup"] == 1.5
    assert not paths["shared_prefill"]["on"] and not paths["shared_prefill"]["exact"]  # 0.1 apart, and slower
    assert paths["lean_layers"]["on"]  # kept
    assert rows[1]["run"].startswith("benchmarks/dpo_vs_trl.py, grpo_vs_trl.py --record: ")
