#!/usr/bin/env bash
# The default configuration (dtype auto, k auto, lossless, model drafter) against plain decoding:
# per Spec-Bench category (2 prompts from each of the 13), k=auto against a fixed-K sweep
# (HumanEval's first 6), and HumanEval's first 20; all greedy at 128 new tokens. The first run,
# benchmarks/humaneval20-128-peers-avx2, also had plain decoding in bf16, transformers' assisted
# generation and llama.cpp (kept commented out below). Folders are named after the machine kind
# (avx512bf16 / avx2, from /proc/cpuinfo; KIND=... overrides). Resumable: rerun to continue.
# Needs: pip install -e '.[all]' llama-cpp-python, and nothing else running (timings).
set -euo pipefail
cd "$(dirname "$0")/.."
KIND=${KIND:-$(grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && echo avx512bf16 || echo avx2)}
# The figures were measured on the transformers backend; with llama-cpp-python installed, backend
# auto would now pick llama.cpp for the bundled pair, so the backend is named (BACKEND=... overrides).
BACKEND=${BACKEND:-transformers}
run() { specdec bench -q --backend "$BACKEND" --max-new-tokens 128 "$@" > /dev/null; }
# peers and plain decoding in both dtypes (measured at a5bb4fb)
# run --dataset humaneval --limit 20 --policies "ar,ar:dtype=bfloat16,lossless" --peers "hf-assisted,llama-cpp" --out "benchmarks/humaneval20-128-peers-$KIND"
run --dataset spec-bench --limit 2 --policies "ar,lossless" --out "benchmarks/specbench26-128-$KIND"
run --dataset humaneval --limit 6 --out "benchmarks/humaneval6-128-ksweep-$KIND" \
  --policies "ar,lossless,lossless:min_confidence=0.4,lossless:k=4,lossless:k=8,lossless:k=12,lossless:k=16"
run --dataset humaneval --limit 20 --policies "ar,lossless" --out "benchmarks/humaneval20-128-$KIND"
