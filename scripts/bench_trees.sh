#!/usr/bin/env bash
# Token trees against chains at the same verify width (chain K=8 and a tree of 8 nodes both have
# the target score 9 tokens per pass), lossless and fly+mars, on HumanEval's first 10 problems and
# 20 Spec-Bench prompts (2 from each of 10 categories), greedy and at T=1 (seeded); at T=1 also
# block verification against token-wise (lossless) on the same chain. Folders are named after the
# machine kind (avx512bf16 / avx2, from /proc/cpuinfo; KIND=... overrides).
# Resumable: rerun to continue (each bench resumes its folder). Needs nothing else running.
set -euo pipefail
cd "$(dirname "$0")/.."
TOKENS=${TOKENS:-64}
KIND=${KIND:-$(grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && echo avx512bf16 || echo avx2)}
SB=spec-bench:translation,summarization,qa,math_reasoning,rag,writing,roleplay,reasoning,coding,stem
CHAINS="ar,lossless:k=8,lossless:drafter=tree:tree_nodes=8,fly+mars:k=8,fly+mars:drafter=tree:tree_nodes=8"
SAMPLED="$CHAINS,block:k=8"
# The figures were measured on the transformers backend; with llama-cpp-python installed, backend
# auto would now pick llama.cpp for the bundled pair, so the backend is named (BACKEND=... overrides).
BACKEND=${BACKEND:-transformers}
run() { specdec bench -q --backend "$BACKEND" --max-new-tokens "$TOKENS" "$@" > /dev/null; }
run --dataset humaneval --limit 10 --policies "$CHAINS" --out "benchmarks/humaneval10-$TOKENS-trees-t0-$KIND"
run --dataset "$SB" --limit 2 --policies "$CHAINS" --out "benchmarks/specbench20-$TOKENS-trees-t0-$KIND"
run --dataset humaneval --limit 10 --temperature 1 --seed 0 --policies "$SAMPLED" --out "benchmarks/humaneval10-$TOKENS-trees-t1-$KIND"
run --dataset "$SB" --limit 2 --temperature 1 --seed 0 --policies "$SAMPLED" --out "benchmarks/specbench20-$TOKENS-trees-t1-$KIND"
