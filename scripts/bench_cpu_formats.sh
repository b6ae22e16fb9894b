#!/usr/bin/env bash
# Plain decoding (ar) and the default (lossless, draft model, k=auto, draft window auto, draft format
# auto) on the llama.cpp backend, for the bundled 1.5B target in several weight formats with the
# bundled draft: HumanEval first 20 and Spec-Bench 2 per category, 256 new tokens, greedy.
# One folder per (dataset, format) under benchmarks/, named with this machine's kind (avx512bf16 or
# avx2); rerunning resumes. Nothing else may run on the machine meanwhile (speed figures).
#
#   bash scripts/bench_cpu_formats.sh                  # q4_k_m (as shipped), q8_0, bf16
#   FORMATS="f16" DATASETS="humaneval" bash scripts/bench_cpu_formats.sh
#   POLICIES="ar,lossless,lossless:drafter=model+pld" FORMATS=q4_k_m DATASETS=spec-bench bash scripts/bench_cpu_formats.sh
set -euo pipefail
cd "$(dirname "$0")/.."
kind=$(grep -qw avx512_bf16 /proc/cpuinfo && echo avx512bf16 || echo avx2)
FORMATS=${FORMATS:-"q4_k_m q8_0 bf16"}
DATASETS=${DATASETS:-"humaneval spec-bench"}
POLICIES=${POLICIES:-"ar,lossless"}
DRAFT=${DRAFT:-auto}      # none: no draft model (drafters that need none)
PREFIX=${PREFIX:-cpu-formats}
SUFFIX=${SUFFIX:-}        # appended to the folder names (another run beside an existing folder)
for dataset in $DATASETS; do
  limit=20; [ "$dataset" = spec-bench ] && limit=2
  for fmt in $FORMATS; do
    target=qwen2.5-coder-1.5b; [ "$fmt" != q4_k_m ] && target="qwen2.5-coder-1.5b@$fmt"
    out="benchmarks/${PREFIX}-${dataset}${limit}-256-${fmt}-${kind}${SUFFIX}"
    echo "== $dataset, target $target -> $out" >&2
    specdec bench --dataset "$dataset" --limit "$limit" --max-new-tokens 256 --policies "$POLICIES" \
      --backend llama.cpp --target "$target" --draft "$DRAFT" --out "$out" --no-plots
  done
done
