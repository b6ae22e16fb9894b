#!/usr/bin/env bash
# The issue-8 figures: the default configuration (dtype auto, k auto, lossless, model drafter)
# against plain decoding in both dtypes, transformers' assisted generation and llama.cpp; per
# Spec-Bench category; and k=auto against a fixed-K sweep. Resumable: rerun to continue.
# Needs: pip install -e '.[all]' llama-cpp-python; nothing else running (timings).
set -euo pipefail
cd "$(dirname "$0")/.."
specdec bench --dataset humaneval --limit 20 --max-new-tokens 128 -q \
  --policies "ar,ar:dtype=bfloat16,lossless" --peers "hf-assisted,llama-cpp" --out benchmarks/issue8-he20 > /dev/null
specdec bench --dataset spec-bench --limit 2 --max-new-tokens 128 -q \
  --policies "ar,lossless" --out benchmarks/issue8-sb26 > /dev/null
specdec bench --dataset humaneval --limit 6 --max-new-tokens 128 -q \
  --policies "ar,lossless,lossless:k=4,lossless:k=8,lossless:k=12,lossless:k=16" --out benchmarks/issue8-he6-ksweep > /dev/null
