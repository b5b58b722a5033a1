"""The reuse cache (ablate.data.cache): a hit gives the computed rows; every key input misses when it
changes; a damaged, partial or half-written entry is never used; racing processes compute once;
`ablate cache ls|clear`. Training with and without it: tests/integration/test_cache_losses.py."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from ablate.data import cache as reuse
from ablate.data.tokenize import prepare_preference
from ablate.methods.dpo import DPOConfig, DPOTrainer
from ablate.models import tiny

ROWS = [
    {"prompt": f"sort: {w} =", "chosen": " " + "".join(sorted(w)), "rejected": " " + w[::-1]}
    for w in ("cba", "hgfedcba", "zyxw", "edc", "qpon", "lkji", "tsr", "vu")
]
LENGTHS = {"max_length": 64, "max_prompt_length": None, "max_completion_length": None}


def _tokenized(cache: reuse.Cache, rows: list[dict], tok, calls: list[int], **lengths) -> Dataset:
    """DPO's tokenization through `cache`, counting the computations in `calls`."""
    data = Dataset.from_list(rows)
    args = {**LENGTHS, **lengths}

    def compute() -> Dataset:
        calls.append(1)
        return prepare_preference(data, tok, **args)

    return cache.dataset(
        "tokenized",
        "tokenized train pairs",
        lambda: reuse.tokenized_key(data, tok, DPOTrainer, args),
        compute,
    )


@pytest.fixture
def tok():
    return tiny()[0]


def test_a_hit_gives_the_computed_rows_without_computing(tmp_path, tok) -> None:
    calls: list[int] = []
    first = _tokenized(reuse.Cache(dir=str(tmp_path)), ROWS, tok, calls)
    cache = reuse.Cache(dir=str(tmp_path))
    again = _tokenized(cache, ROWS, tok, calls)
    assert calls == [1] and again[:] == first[:] and again.features == first.features
    assert [e["hit"] for e in cache.events] == [True]
    off = reuse.Cache(enabled=False, dir=str(tmp_path / "never"))
    assert _tokenized(off, ROWS, tok, calls)[:] == first[:] and calls == [1, 1]
    assert not (tmp_path / "never").exists() and off.events == []  # off: nothing read, nothing written


def test_a_hit_says_the_warnings_the_computation_said(tmp_path, tok, caplog) -> None:
    """Pairs dropped by max_length are reported on a hit too (the same line)."""
    calls: list[int] = []
    rows = ROWS + [
        {"prompt": "x" * 80, "chosen": " a", "rejected": " b"}
    ]  # its prompt alone fills max_length
    with caplog.at_level(logging.WARNING, logger="ablate"):
        _tokenized(reuse.Cache(dir=str(tmp_path)), rows, tok, calls)
        computed = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        caplog.clear()
        _tokenized(reuse.Cache(dir=str(tmp_path)), rows, tok, calls)
        replayed = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert calls == [1] and len(computed) == 1 and replayed == computed


def test_each_tokenization_input_changes_the_key(tok) -> None:
    data = Dataset.from_list(ROWS)
    base = reuse.key_digest("tokenized", reuse.tokenized_key(data, tok, DPOTrainer, LENGTHS))
    assert base == reuse.key_digest(
        "tokenized", reuse.tokenized_key(Dataset.from_list(ROWS), tok, DPOTrainer, dict(LENGTHS))
    )  # the same inputs: the same key
    one_row = [dict(ROWS[0], chosen=" abd")] + ROWS[1:]
    templated = tiny()[0]
    templated.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    changed = {
        "one data row": reuse.tokenized_key(Dataset.from_list(one_row), tok, DPOTrainer, LENGTHS),
        "max_length": reuse.tokenized_key(data, tok, DPOTrainer, {**LENGTHS, "max_length": 63}),
        "the chat template": reuse.tokenized_key(data, templated, DPOTrainer, LENGTHS),
        "a trainer of your own": reuse.tokenized_key(data, tok, type("Mine", (DPOTrainer,), {}), LENGTHS),
    }
    for what, key in changed.items():
        assert reuse.key_digest("tokenized", key) != base, what


def _trainer(tmp_path: Path, model, **args) -> DPOTrainer:
    config = DPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        report_to="none",
        use_cpu=True,
        max_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        **args,
    )
    return DPOTrainer(
        model=model, args=config, train_dataset=Dataset.from_list(ROWS), processing_class=tiny()[0]
    )


def test_reference_logps_miss_on_weights_and_precision(tmp_path) -> None:
    model = tiny()[1]
    trainer = _trainer(tmp_path, model)
    data, rows = trainer.train_dataset, [0, 1, 2]
    base = reuse.key_digest("ref_logps", trainer._ref_key(data, rows))
    assert base == reuse.key_digest("ref_logps", trainer._ref_key(data, rows))
    trainer.args.bf16 = True  # precision (its autocast)
    assert reuse.key_digest("ref_logps", trainer._ref_key(data, rows)) != base
    trainer.args.bf16 = False
    with torch.no_grad():  # one weight moved by one ulp
        w = next(model.parameters())
        w.view(-1)[0] = torch.nextafter(w.view(-1)[0], torch.tensor(1.0))
    assert reuse.key_digest("ref_logps", trainer._ref_key(data, rows)) != base
    assert reuse.key_digest("ref_logps", trainer._ref_key(data, [0, 1])) != reuse.key_digest(
        "ref_logps", trainer._ref_key(data, rows)
    )  # the rows scored


def _bits(columns: dict) -> dict:
    """Columns with every float as its exact hex (NaN equal to NaN)."""
    return {k: [x.hex() if isinstance(x, float) else x for x in v] for k, v in columns.items()}


def test_reference_logps_from_the_cache_are_the_computed_ones(tmp_path) -> None:
    cache = reuse.Cache(dir=str(tmp_path / "c"))
    plain = _trainer(tmp_path, tiny()[1])  # no cache
    runs = [
        DPOTrainer(
            model=tiny()[1],
            args=plain.args,
            train_dataset=Dataset.from_list(ROWS),
            processing_class=tiny()[0],
            cache=cache,
        )
        for _ in range(2)
    ]
    assert [e["hit"] for e in cache.events] == [False, False, True, True]  # the second found both entries
    assert any(x != x for x in plain.train_dataset["ref_chosen_logps"])  # rows not drawn: NaN
    for trainer in runs:
        assert _bits(trainer.train_dataset[:]) == _bits(plain.train_dataset[:])  # bit for bit


def test_sft_examples_come_from_the_cache_and_miss_on_their_loss_mask(tmp_path) -> None:
    from ablate.data import packaged
    from ablate.methods.sft import SFTConfig, SFTTrainer

    cache = reuse.Cache(dir=str(tmp_path / "c"))
    rows = packaged("sort_sft", with_eval=False).train

    def build(**args) -> SFTTrainer:
        config = SFTConfig(
            output_dir=str(tmp_path / "out"), max_steps=1, report_to="none", use_cpu=True, **args
        )
        return SFTTrainer(
            model=tiny()[1], args=config, train_dataset=rows, processing_class=tiny()[0], cache=cache
        )

    first, again, other = build(), build(), build(completion_only_loss=False)
    assert [e["hit"] for e in cache.events] == [False, True, False]
    assert again.train_dataset[:] == first.train_dataset[:] != other.train_dataset[:]


def _entry(root: Path) -> Path:
    (entry,) = [p for p in (root / "tokenized").iterdir() if p.is_dir()]
    return entry


def test_a_corrupt_entry_is_said_in_one_line_and_recomputed(tmp_path, tok, caplog) -> None:
    calls: list[int] = []
    first = _tokenized(reuse.Cache(dir=str(tmp_path)), ROWS, tok, calls)
    arrow = next(_entry(tmp_path).rglob("*.arrow"))
    raw = bytearray(arrow.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one flipped bit
    arrow.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="ablate"):
        again = _tokenized(reuse.Cache(dir=str(tmp_path)), ROWS, tok, calls)
    lines = [r.getMessage() for r in caplog.records if "cache" in r.getMessage()]
    assert calls == [1, 1] and again[:] == first[:]
    assert len(lines) == 1 and "checksum mismatch" in lines[0] and "recomputing" in lines[0], lines
    assert reuse.check(_entry(tmp_path)) is None  # stored again, whole


def test_an_entry_without_its_manifest_is_never_used(tmp_path, tok, caplog) -> None:
    calls: list[int] = []
    _tokenized(reuse.Cache(dir=str(tmp_path)), ROWS, tok, calls)
    (_entry(tmp_path) / reuse.MANIFEST).unlink()  # as a writer that died before its last file
    with caplog.at_level(logging.WARNING, logger="ablate"):
        _tokenized(reuse.Cache(dir=str(tmp_path)), ROWS, tok, calls)
    assert calls == [1, 1] and any("incomplete (no manifest)" in r.getMessage() for r in caplog.records)


WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from datasets import Dataset
    from ablate.data import cache as reuse
    root, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "die":  # stop for good just before the manifest: the test kills this process there
        def stuck(path, text):
            (root / "writing").touch()
            time.sleep(600)
        reuse._write_synced = stuck
    def compute():
        with (root / "computed").open("a") as f:
            f.write("1\\n")
        time.sleep(1.0 if mode == "race" else 0)  # long enough for the other process to reach the lock
        return Dataset.from_dict({"x": [[1, 2], [3]]})
    out = reuse.Cache(dir=str(root / "c")).dataset("tokenized", "t", lambda: {"k": 1}, compute)
    print(out[:])
""")


def _writer(root: Path, mode: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), mode],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_kill_9_while_writing_leaves_no_entry_that_is_used(tmp_path) -> None:
    p = _writer(tmp_path, "die")
    deadline = time.time() + 120
    while not (tmp_path / "writing").exists():
        assert p.poll() is None and time.time() < deadline, p.communicate()
        time.sleep(0.1)
    p.send_signal(signal.SIGKILL)
    p.wait()
    kind = tmp_path / "c" / "tokenized"
    assert [q.name for q in kind.iterdir() if q.is_dir() and not q.name.startswith(".tmp-")] == []
    assert (
        reuse.entries(tmp_path / "c") == []
    )  # the half-written dir is no entry, for `ablate cache ls` either
    done = _writer(tmp_path, "once")  # the lock died with the writer; the next run computes and stores
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0, err
    assert (tmp_path / "computed").read_text() == "1\n1\n"
    assert len(reuse.entries(tmp_path / "c")) == 1 and not list(kind.glob(".tmp-*"))


def test_two_processes_racing_for_one_entry_compute_it_once(tmp_path) -> None:
    procs = [_writer(tmp_path, "race") for _ in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert (tmp_path / "computed").read_text() == "1\n"  # one computed, the other waited and loaded
    assert outs[0][0] == outs[1][0] == "{'x': [[1, 2], [3]]}\n"
    (entry,) = reuse.entries(tmp_path / "c")
    assert reuse.check(Path(entry["path"])) is None


def test_cache_ls_and_clear(tmp_path, tok) -> None:
    from conftest import ablate

    _tokenized(reuse.Cache(dir=str(tmp_path / "c" / "entries")), ROWS, tok, [])
    env = {"ABLATE_CACHE": str(tmp_path / "c")}
    ls = ablate("cache", "ls", env=env, cwd=tmp_path)
    assert ls.returncode == 0, ls.stderr
    line, total = ls.stdout.splitlines()
    assert line.startswith("tokenized ") and "KiB" in line and "tokenized train pairs (8 rows)" in line
    assert total.startswith("1 entry, ") and str(tmp_path / "c" / "entries") in total
    cleared = ablate("cache", "clear", env=env, cwd=tmp_path)
    assert cleared.returncode == 0 and cleared.stdout.startswith("removed 1 entry (")
    assert ablate("cache", "ls", env=env, cwd=tmp_path).stdout.startswith("0 entries, 0 B")


def test_cache_clear_removes_only_ablates_entries(tmp_path, tok) -> None:
    """Issue 32: `cache clear --dir D` on a folder that holds other things deleted every dir two
    levels down (`photos/2024`, `projectA/src`). Only a dir proven to be one of ablate's entries (its
    manifest, or the marker written before anything else) is removed; anything else is left and named."""
    from conftest import ablate

    root = tmp_path / "D"
    _tokenized(reuse.Cache(dir=str(root)), ROWS, tok, [])
    mine = {
        "photos/2024/a.jpg": "jpeg",
        "projectA/src/main.py": "print(1)\n",
        "tokenized/notes/todo.txt": "mine\n",
    }
    for name, text in mine.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    listed = ablate("cache", "ls", "--dir", str(root), cwd=tmp_path)
    assert listed.returncode == 0 and listed.stdout.startswith("tokenized ") and "photos" not in listed.stdout
    assert "1 entry, " in listed.stdout, listed.stdout
    cleared = ablate("cache", "clear", "--dir", str(root), cwd=tmp_path)
    assert cleared.returncode == 0, cleared.stderr
    assert cleared.stdout.startswith("removed 1 entry ("), cleared.stdout
    assert {n: (root / n).read_text() for n in mine} == mine  # every file of the user's, as it was
    assert (
        len(cleared.stderr.strip().splitlines()) == 1
        and "left 3 paths that are not ablate's cache entries" in cleared.stderr
        and "photos, projectA, tokenized/notes" in cleared.stderr
    ), cleared.stderr
    assert reuse.entries(root) == []


def test_cache_clear_on_a_folder_that_holds_no_cache_is_refused(tmp_path) -> None:
    from conftest import ablate

    root = tmp_path / "D"
    (root / "photos" / "2024").mkdir(parents=True)
    (root / "photos" / "2024" / "a.jpg").write_text("jpeg")
    for action in ("ls", "clear"):
        r = ablate("cache", action, "--dir", str(root), cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
        assert r.stderr.startswith(f"ablate: error: --dir {root} is not an ablate cache"), r.stderr
    assert (root / "photos" / "2024" / "a.jpg").read_text() == "jpeg"


def test_ablate_cache_naming_a_file_is_refused(tmp_path) -> None:
    from conftest import ablate

    (tmp_path / "f").write_text("mine\n")
    for action in ("ls", "clear"):
        r = ablate("cache", action, env={"ABLATE_CACHE": str(tmp_path / "f")}, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
        assert f"ABLATE_CACHE={tmp_path / 'f'} is a file, not a directory" in r.stderr, r.stderr
    assert (tmp_path / "f").read_text() == "mine\n"
