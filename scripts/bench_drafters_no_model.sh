#!/usr/bin/env bash
# Drafters that need no draft model (prompt lookup, suffix decoding, lookahead decoding) against plain
# decoding on the llama.cpp backend, no draft model loaded: HumanEval first 20 and Spec-Bench 2 per
# category, 256 new tokens, greedy, k=auto. One folder per (dataset, target format) under benchmarks/,
# named with this machine's kind (avx512bf16 or avx2); rerunning resumes. Nothing else may run on the
# machine meanwhile (speed figures).
#
#   bash scripts/bench_drafters_no_model.sh                              # bf16 and q4_k_m, both datasets
#   FORMATS=bf16 DATASETS=humaneval bash scripts/bench_drafters_no_model.sh
#   POLICIES=ar,lossless:drafter=lookahead SUFFIX=-lookahead-probe-credit DATASETS=humaneval bash scripts/bench_drafters_no_model.sh
set -euo pipefail
cd "$(dirname "$0")/.."
kind=$(grep -qw avx512_bf16 /proc/cpuinfo && echo avx512bf16 || echo avx2)
FORMATS=${FORMATS:-"bf16 q4_k_m"}
DATASETS=${DATASETS:-"humaneval spec-bench"}
POLICIES=${POLICIES:-"ar,lossless:drafter=pld,lossless:drafter=suffix,lossless:drafter=lookahead"}
SUFFIX=${SUFFIX:-}  # appended to the folder names (another run beside an existing folder)
for dataset in $DATASETS; do
  limit=20; [ "$dataset" = spec-bench ] && limit=2
  for fmt in $FORMATS; do
    target=qwen2.5-coder-1.5b; [ "$fmt" != q4_k_m ] && target="qwen2.5-coder-1.5b@$fmt"
    out="benchmarks/drafters-${dataset}${limit}-256-${fmt}-${kind}${SUFFIX}"
    echo "== $dataset, target $target -> $out" >&2
    specdec bench --dataset "$dataset" --limit "$limit" --max-new-tokens 256 --policies "$POLICIES" \
      --backend llama.cpp --target "$target" --draft none --out "$out" --no-plots
  done
done
