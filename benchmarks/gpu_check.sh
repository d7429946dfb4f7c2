#!/usr/bin/env bash
# The CUDA checks of the repository in one short run (docs/gpu.md): under five minutes on one
# GPU machine. Without CUDA it says so and exits 0; any failing check exits non-zero.
#   bash benchmarks/gpu_check.sh            # from the repository root
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"  # the interpreter that holds torch (PYTHON=... to choose another)

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: torch sees no CUDA device; nothing to check (skipped)"
    exit 0
fi
"$PY" -c 'import torch; n = torch.cuda.device_count(); print(f"gpu_check: {n} CUDA device(s):", ", ".join(torch.cuda.get_device_name(i) for i in range(n)))'

# -m gpu: only the tests marked as needing CUDA. Each line, what it checks:
#   memtrace: CudaProbe against torch.cuda.memory_allocated, the live-tensor tracker on CUDA
#   chunk: pinned host payloads, real device copies, side-stream prefetch
#   stack: every plugin on one device (DDP, ZeRO-1/2, Gemini, hybrid on one process) against
#          CPU AdamW, nothing left on the host after a step, and with two devices the NCCL
#          2-process runs of tp2, pp2, ring sp2 and ZeRO-2 through `colossal run`
failed=0
timeout 280 "$PY" -m pytest -q -p no:cacheprovider -m gpu \
    packages/colossal-memtrace/tests/test_probes.py \
    packages/colossal-chunk/tests/test_gpu.py \
    packages/colossal-stack/tests/test_gpu_plugins.py || failed=1
#   zero: Gemini on CUDA with prefetch against AdamW, bf16; ZeRO-1/2 and Gemini in precision
#         fp64 on CUDA against float64 AdamW within 1e-12 (its tests skip without CUDA)
timeout 90 "$PY" -m pytest -q -p no:cacheprovider packages/colossal-zero/tests/test_cuda.py \
    packages/colossal-zero/tests/test_fp64_precision.py -k cuda || failed=1
if [ "$failed" != 0 ]; then echo "gpu_check: FAILED (see above)"; exit 1; fi
echo "gpu_check: passed"
