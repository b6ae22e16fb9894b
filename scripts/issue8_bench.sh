#!/usr/bin/env bash
# The issue-8 figures: the default configuration (dtype auto, k auto, lossless, model drafter)
# against plain decoding, per Spec-Bench category, k=auto against a fixed-K sweep, and (first run,
# benchmarks/issue8-he20) against plain decoding in bf16, transformers' assisted generation and
# llama.cpp. Resumable: rerun to continue. Needs: pip install -e '.[all]' llama-cpp-python, and
# nothing else running (timings).
set -euo pipefail
cd "$(dirname "$0")/.."
run() { specdec bench -q --max-new-tokens 128 "$@" > /dev/null; }
# peers and plain decoding in both dtypes (measured at a5bb4fb)
# run --dataset humaneval --limit 20 --policies "ar,ar:dtype=bfloat16,lossless" --peers "hf-assisted,llama-cpp" --out benchmarks/issue8-he20
run --dataset spec-bench --limit 2 --policies "ar,lossless" --out benchmarks/issue8-sb26
run --dataset humaneval --limit 6 --out benchmarks/issue8-he6-ksweep \
  --policies "ar,lossless,lossless:min_confidence=0.4,lossless:k=4,lossless:k=8,lossless:k=12,lossless:k=16"
run --dataset humaneval --limit 20 --policies "ar,lossless" --out benchmarks/issue8-he20-final
