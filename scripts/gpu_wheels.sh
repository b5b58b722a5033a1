#!/usr/bin/env bash
# The wheels a GPU machine without a package index needs to run benchmarks/gpu.py and scripts/gpu_smoke.sh,
# downloaded here into .gpu_wheels/ (git-ignored) for Python 3.12 on manylinux x86_64. The machine's image
# already has torch (2.11, cu130), accelerate, peft, pyarrow, tokenizers 0.23, huggingface_hub 1.x, triton,
# numpy, psutil, pyyaml, safetensors, requests, tqdm; huggingface_hub 2.x is NOT carried (it needs
# httpx2/httpcore2, absent there). bitsandbytes' wheel is trimmed to its CPU and CUDA 13.0 libraries
# (~7 MB instead of ~43); antlr4-python3-runtime has only an sdist, so its wheel is built here.
#
#   bash scripts/gpu_wheels.sh              # -> .gpu_wheels/*.whl, their total size, the install line
#
# On the GPU machine, from the repo root (ablate itself runs from src/: no build backend needed there):
#   python -m pip install --no-index --no-deps .gpu_wheels/*.whl && export PYTHONPATH=$PWD/src
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.gpu_wheels
rm -rf "$OUT" && mkdir -p "$OUT"
PY=(--python-version 3.12 --implementation cp --abi cp312 --only-binary=:all: --no-deps
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform any)
# the versions the tests run (constraints.txt), and what they need that the image lacks
WHEELS=(transformers==5.24.0 datasets==5.2.0 dill multiprocess xxhash fsspec hydra-core==1.3.8 omegaconf==2.3.1
        hydra-joblib-launcher==1.2.0 joblib==1.6.0 gguf==0.19.0 trl==1.16.0 liger-kernel==0.8.5 bitsandbytes==0.50.2)
# dill and multiprocess at the versions datasets 5.2 takes; xxhash/fsspec likewise (small; the image may lack them)
pip download "${PY[@]}" -d "$OUT" -c <(grep -vi '^\(dill\|multiprocess\|xxhash\|fsspec\)' constraints.txt) \
  "${WHEELS[@]}" -q
pip wheel --no-deps --no-build-isolation -w "$OUT" antlr4-python3-runtime==4.9.3 -q
python3 - "$OUT" <<'PY'
import hashlib, base64, os, sys, zipfile
out = sys.argv[1]
for name in os.listdir(out):
    if not name.startswith("bitsandbytes-"):
        continue
    path = os.path.join(out, name)
    # the CPU and CUDA 13.0 libraries only (not the other CUDA, ROCm and XPU builds)
    keep = lambda f: not f.startswith("bitsandbytes/libbitsandbytes_") or f.endswith(("_cpu.so", "_cuda130.so"))  # noqa: E731
    with zipfile.ZipFile(path) as src:
        items = [(i, src.read(i.filename)) for i in src.infolist() if keep(i.filename)]
    record = next(i.filename for i, _ in items if i.filename.endswith(".dist-info/RECORD"))
    with zipfile.ZipFile(path + ".tmp", "w", zipfile.ZIP_DEFLATED) as dst:
        lines = []
        for info, data in items:
            if info.filename == record:
                continue
            dst.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines.append(f"{info.filename},sha256={digest},{len(data)}")
        dst.writestr(record, "\n".join(lines + [f"{record},,"]) + "\n")
    os.replace(path + ".tmp", path)
    print(f"trimmed {name} to its CPU and CUDA 13.0 libraries")
PY
ls -la "$OUT"
total=$(du -cb "$OUT"/*.whl | tail -1 | cut -f1)
echo "total $((total / 1024 / 1024)) MiB in $OUT (the device run carries at most 64 MiB)"
echo "install on the GPU machine: python -m pip install --no-index --no-deps $OUT/*.whl && export PYTHONPATH=\$PWD/src"
