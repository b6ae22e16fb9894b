#!/usr/bin/env bash
# The one device run behind benchmarks/gpu-fused-h200: pass timings (scripts/gpu_fused_passes.py),
# the CUDA capture tests (tests/test_cuda_capture.py) and every rule's checks with graphs
# (scripts/cuda_rules_check.py), each in its own time box; everything written to OUT (default $OUT).
set -u
out=${1:-$OUT}
export PYTHONPATH=$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } >"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
timeout "${PASSES_S:-150}" python3 scripts/gpu_fused_passes.py "$out" --kinds ${KINDS:-modules,fused} --widths 1,5,8 2>&1 | tee "$out/passes.log"
timeout "${TESTS_S:-60}" python3 -m pytest -q -p no:cacheprovider tests/test_cuda_capture.py -k "not every_rule" 2>&1 | tee "$out/cuda_tests.log"
timeout "${RULES_S:-120}" python3 scripts/cuda_rules_check.py --device cuda --cache graphs --out "$out/cuda_rules_check.json" 2>&1 | tee "$out/cuda_rules_check.log"
timeout "${COMPILED_S:-120}" python3 scripts/gpu_fused_passes.py "$out" --kinds compiled --roles ${COMPILED_ROLES:-target,draft} --widths 1,5 --ks 4 2>&1 | tee -a "$out/passes.log"
