#!/usr/bin/env bash
# The tree size: chains and trees of 8, 16 and 32 scored tokens per pass, lossless and fly+mars,
# greedy, on HumanEval's first 10 problems and the same 20 Spec-Bench prompts as
# scripts/bench_trees.sh, with the default chain (k=auto) beside them. Wider trees pay only
# where a wide verify pass costs little more than a narrow one (the cost model's table): run it
# on each machine kind; folders are named after it (avx512bf16 / avx2, from /proc/cpuinfo).
# Resumable: rerun to continue. Needs nothing else running.
set -euo pipefail
cd "$(dirname "$0")/.."
TOKENS=${TOKENS:-64}
KIND=${KIND:-$(grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && echo avx512bf16 || echo avx2)}
SB=spec-bench:translation,summarization,qa,math_reasoning,rag,writing,roleplay,reasoning,coding,stem
T=lossless:drafter=tree
SIZES="ar,lossless,lossless:k=8,lossless:k=16,lossless:k=32,$T:tree_nodes=8,$T:tree_nodes=16,$T:tree_nodes=16:tree_width=4,$T:tree_nodes=32:tree_width=4,fly+mars:k=16,fly+mars:drafter=tree:tree_nodes=16:tree_width=4"
# The figures were measured on the transformers backend; with llama-cpp-python installed, backend
# auto would now pick llama.cpp for the bundled pair, so the backend is named (BACKEND=... overrides).
BACKEND=${BACKEND:-transformers}
run() { specdec bench -q --backend "$BACKEND" --max-new-tokens "$TOKENS" --policies "$SIZES" "$@" ${REPORT:+--report-only} > /dev/null; }
run --dataset "$SB" --limit 2 --out "benchmarks/specbench20-$TOKENS-treesizes-$KIND"
run --dataset humaneval --limit 10 --out "benchmarks/humaneval10-$TOKENS-treesizes-$KIND"
