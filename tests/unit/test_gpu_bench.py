"""benchmarks/gpu.py's own logic, without running a benchmark: the smoke lines compose (the issue's tf32 and
QLoRA DPO/SFT/GRPO among them), the wide tokenizer decodes every id a model can sample, and the verdicts
that `--record` writes follow the rule (exact on the device and not slower than speed=off). The script's
CPU mode runs end to end in tests/slow/test_gpu_bench_cpu.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from ablate.paths import conf_dir
from ablate.config.compose import register_resolvers

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu  # noqa: E402  (benchmarks/gpu.py: its parent side imports no torch)
import gpu_sides  # noqa: E402


def test_smoke_lines_include_tf32_and_qlora_and_compose():
    names = {name for name, _, _ in gpu.SMOKE}
    assert {"bf16_tf32", "fp32_tf32", "qlora_dpo", "qlora_sft", "qlora_grpo", "fp16", "ref_4bit"} <= names
    assert {name for name, _, cpu in gpu.SMOKE if cpu} == {"dpo", "grpo"}  # --tiny on a CPU
    register_resolvers()
    for name, overrides, _ in gpu.SMOKE:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[*overrides, "method.args.max_steps=10"])
        assert cfg.method.args.max_steps == 10, name
        if "tf32" in name:
            assert cfg.precision.tf32 is True


def test_wide_tokenizer_encodes_bytes_and_decodes_every_id():
    from ablate.models.tokenizer import byte_tokenizer

    tok = gpu_sides.wide_tokenizer(2048)
    assert len(tok) == 2048 and tok("abc z")["input_ids"] == byte_tokenizer()("abc z")["input_ids"]
    assert isinstance(tok.decode(list(range(2048))), str)  # any sampled id decodes (GRPO's rewards read text)


def _row(impl: str, s: float) -> dict:
    return {"impl": impl, "s_per_step": s}


def test_verdicts_follow_the_rule():
    """A path is on when the exact section found it exact and its table ran it no slower than speed=off (an
    opt-in switch: no slower than every path forced); a path missing from either is not recorded."""
    out = {
        "exact": {
            "paths": {
                "padding_free": {"exact": True, "max_abs_diff": 1e-6},
                "dpo_pair_rows": {"exact": True, "max_abs_diff": 2e-6},
                "completion_only_logits": {"exact": False, "max_abs_diff": 0.3},
                "liger": {"exact": True, "max_abs_diff": 1e-5},
                "shared_prefill": {"exact": True, "max_abs_diff": None},
            }
        },
        "dpo": {
            "title": "dpo 0.5b bf16",
            "rows": [
                _row("trl", 0.30),
                _row("ablate:off", 0.30),
                _row("ablate:forced", 0.20),
                _row("ablate:padding_free", 0.25),
                _row("ablate:dpo_pair_rows", 0.33),
                _row("ablate:completion_only_logits", 0.2),
                _row("ablate:forced+liger", 0.19),
            ],
        },
        "grpo": {
            "title": "grpo 0.5b bf16",
            "rows": [_row("ablate:off", 3.0), _row("ablate:shared_prefill", 2.0)],
        },
    }
    v = gpu.verdicts(out)
    assert set(v) == {"padding_free", "dpo_pair_rows", "completion_only_logits", "liger", "shared_prefill"}
    assert v["padding_free"]["speedup"] == pytest.approx(1.2) and v["dpo_pair_rows"]["speedup"] < 1
    assert v["padding_free"]["basis"] == "dpo 0.5b bf16: 0.250 s/step against speed=off's 0.300 (1.20x)"
    assert v["liger"]["basis"].endswith("against forced's 0.200 (1.05x)")
    from ablate.speed.measured import verdict

    on = {name for name, r in v.items() if verdict(r["exact"], r["speedup"])}
    assert on == {
        "padding_free",
        "liger",
        "shared_prefill",
    }  # dpo_pair_rows slower, completion_only_logits not exact


def test_record_round_trip(tmp_path, monkeypatch):
    """What --record writes is what the speed plan reads: a path on by the rule runs on CUDA by default."""
    from ablate.speed import measured
    from ablate.speed.plan import DPO, SpeedSwitches, Setting, resolve

    record = tmp_path / "measured.json"
    monkeypatch.setattr(measured, "RECORD", record)
    measured.write(
        "cuda",
        "benchmarks/gpu.py on a test",
        {
            "padding_free": {"exact": True, "max_abs_diff": 1e-6, "speedup": 1.2, "basis": "dpo: 1.20x"},
            "lean_layers": {"exact": True, "max_abs_diff": 0.0, "speedup": 0.9, "basis": "dpo: 0.90x"},
        },
    )
    assert json.loads(record.read_text())["cuda"]["paths"]["padding_free"]["on"] is True
    plan = resolve(
        "policy", Setting(model_type="llama", attention="sdpa", device="cuda"), SpeedSwitches(), DPO
    )
    assert [d.name for d in plan.decisions if d.on] == ["padding_free"]


def test_each_ablate_variant_is_its_own_process_and_a_hang_loses_only_itself(monkeypatch):
    """On the H200 (2026-12-04) the dpo section ran ablate's ten variants in one process, which ran past the
    section's time: every ablate number was lost. Each variant is a child of its own now; one that hangs is
    cut at 3x TRL's process time and the others are still measured."""
    calls = []

    def fake_child(cfg, timeout):
        calls.append((cfg["side"], tuple(cfg["variants"]) if cfg["side"] == "ablate" else None, timeout))
        run = {
            "step_seconds": [1.0, 0.5],
            "losses": [0.7, 0.6],
            "tokens": 100,
            "flops_per_token": 6.0,
            "peak_rss_mb": 1.0,
            "peak_flops": 1e12,
        }
        if cfg["side"] == "trl":
            return {"trl": run}, 40.0, ""
        (variant,) = cfg["variants"]
        if variant == "hangs":
            return None, timeout, f"timed out after {timeout:.0f} s"
        return {variant: run}, 20.0, ""

    monkeypatch.setattr(gpu, "child", fake_child)
    cfg = {
        "shape": "0.5b",
        "bf16": True,
        "device": "cuda",
        "variants": {"off": "off", "hangs": {}, "forced": {}},
    }
    out = gpu.timed("dpo", cfg, repeats=1, remaining=600.0)
    assert [c[:2] for c in calls] == [
        ("trl", None),
        ("ablate", ("off",)),
        ("ablate", ("hangs",)),
        ("ablate", ("forced",)),
    ]
    assert calls[2][2] == 120.0  # 3x TRL's 40 s
    assert [r["impl"] for r in out["rows"]] == ["trl", "ablate:off", "ablate:forced"]
    assert out["errors"] == {"ablate:hangs": "timed out after 120 s"}
    short = gpu.timed("dpo", cfg, repeats=1, remaining=50.0)  # TRL's 40 s + off's 20 s: forced never starts
    assert short["errors"]["ablate:forced"] == "not started: past the section's time"


def test_only_keeps_the_named_variants_and_smoke_lines():
    """--only, for a lease of minutes: the named ablate variants in each timed section (TRL always runs: the
    side the variants are measured against) and the named smoke lines."""
    only = {"off", "completion_only_logits", "bf16_tf32"}
    cfgs = gpu.keep_only(gpu.configs("cuda", False), only)
    assert list(cfgs["dpo"]["variants"]) == ["off", "completion_only_logits"]
    assert list(cfgs["dpo_large"]["variants"]) == ["off"] and list(cfgs["grpo"]["variants"]) == ["off"]
    assert cfgs["exact"] == gpu.configs("cuda", False)["exact"]  # exactness checks every path
    assert [n for n, _ in gpu.smoke_lines("cuda", only)] == ["bf16_tf32"]
    assert gpu.keep_only(gpu.configs("cuda", False), None) == gpu.configs("cuda", False)
    assert [n for n, _ in gpu.smoke_lines("cpu")] == ["dpo", "grpo"]


def test_every_section_gets_its_share_of_the_budget():
    """The default run's sections fit the budget: each gets the time left times its share of the sections still
    to run, so a long early section cannot starve the later ones, and time one leaves unused goes to them."""
    order = list(gpu.SECONDS)  # the default run's sections, in its order
    assert order == [
        "exact",
        "dpo",
        "smoke",
        "grpo",
        "sft",
        "dpo_large",
    ]  # the 1.5B one last: on what is left
    assert sum(gpu.SECONDS.values()) == 470  # the default --budget: one ~8-minute device call
    assert gpu.section_seconds("exact", order[1:], 470.0) == pytest.approx(130.0)
    assert gpu.section_seconds("dpo_large", [], 30.0) == 30.0  # the last section: whatever is left
    # exact took 200 s instead of 130: dpo's share of the 270 s left is 160/340 of it, not all of it
    assert gpu.section_seconds("dpo", order[2:], 270.0) == pytest.approx(270.0 * 160 / 340)
    # a run of fewer sections: each gets more (the per-path rows that --record's verdicts need)
    assert gpu.section_seconds("grpo", ["sft"], 360.0) == pytest.approx(360.0 * 70 / 125)
    # the short-lease run (docs/benchmarks.md: exact,dpo,smoke at --budget 280): exact, all or nothing, keeps its
    # 130 s (its share would be 112 s, barely above the 108 s the header and exact took on the H200)
    assert gpu.section_seconds("exact", ["dpo", "smoke"], 280.0) == 130.0
    assert gpu.section_seconds("exact", ["dpo"], 100.0) == 100.0  # never more than is left


def test_sections_keep_their_decisive_rows_first():
    """A section cut short by its share keeps its first rows: after TRL (always first), DPO's forced (every path,
    never measured on a GPU yet) and speed=off; GRPO's and SFT's speed=off (TRL's layout: the agreement check)
    and forced. GRPO's and SFT's tables are TRL's against the same ablate variants as DPO's."""
    for name, cfg in gpu.configs("cuda", False).items():
        if "variants" in cfg:
            first = list(cfg["variants"])[:2]
            assert first == (["forced", "off"] if name.startswith("dpo") else ["off", "forced"]), name
    grpo, sft = gpu.configs("cuda", False)["grpo"], gpu.configs("cuda", False)["sft"]
    assert {"off", "forced", "default", "shared_prefill"} <= set(grpo["variants"])
    assert {"off", "forced", "default", "lean_layers"} <= set(sft["variants"])
    assert grpo["shape"] == sft["shape"] == "0.5b" and grpo["bf16"] and sft["bf16"]


def test_without_a_gpu_the_script_says_so_in_one_line_and_exits_2(monkeypatch):
    """`python benchmarks/gpu.py` on a machine without CUDA: one line naming the CPU dry run, exit 2, nothing run."""
    import subprocess

    import torch

    has_gpu = torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reason = gpu.no_device("cuda")
    assert reason and "no CUDA GPU" in reason and "--device cpu --tiny" in reason and "\n" not in reason
    assert gpu.no_device("cpu") is None
    if not has_gpu:  # the real script, on this machine
        root = Path(gpu.__file__).resolve().parents[1]
        proc = subprocess.run(
            [sys.executable, str(root / "benchmarks/gpu.py"), "--sections", "sft"],
            capture_output=True,
            text=True,
            cwd=root,
            timeout=600,
            check=False,
        )
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.strip().splitlines()[-1] == reason


def test_smoke_lines_past_the_sections_time_are_not_started(tmp_path, capsys):
    out = gpu.smoke("cpu", True, tmp_path, parallel=2, remaining=0.0)
    assert out == {
        "dpo": {"rc": None, "status": "not started", "seconds": 0.0},
        "grpo": {"rc": None, "status": "not started", "seconds": 0.0},
    }
    assert "not started: past the section's time" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())  # nothing run, no run dir
