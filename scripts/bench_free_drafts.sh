#!/usr/bin/env bash
# The default drafter (the portfolio, drafter auto) against plain decoding and each of its copy
# sources alone, on the llama.cpp backend, shipped Q4_K_M pair (or FORMAT=bf16: the @bf16 copy of the
# target), greedy: the edit workload (with llama-cpp-python's and OpenVINO GenAI's plain decoding and
# their own prompt lookup as peers: pip install llama-cpp-python openvino-genai), HumanEval's first 20,
# Spec-Bench 2 per category, and the agent loop. One folder
# per workload under benchmarks/, named with KIND (this machine's kind: avx2, avx512bf16, xeon-amx);
# rerunning resumes. Nothing else may run on the machine meanwhile (speed figures).
#
#   KIND=avx2 bash scripts/bench_free_drafts.sh
#   KIND=avx2 WORKLOADS="edits agent" bash scripts/bench_free_drafts.sh
set -euo pipefail
cd "$(dirname "$0")/.."
KIND=${KIND:?name this machine kind: KIND=avx2, avx512bf16 or xeon-amx}
FORMAT=${FORMAT:-q4_k_m}
WORKLOADS=${WORKLOADS:-"edits humaneval spec-bench agent"}
TARGET=qwen2.5-coder-1.5b
[ "$FORMAT" = q4_k_m ] || TARGET="$TARGET@$FORMAT"
POLICIES="ar,lossless,lossless:drafter=pld,lossless:drafter=suffix"
for w in $WORKLOADS; do
  case $w in
    edits) specdec bench --dataset edits --limit 20 --max-new-tokens 512 --policies "$POLICIES" \
             --peers llama-cpp,llama-cpp-pld,ov,ov-pld --target "$TARGET" --out "benchmarks/edits20-512-$FORMAT-$KIND" ;;
    humaneval) specdec bench --dataset humaneval --limit 20 --max-new-tokens 256 --policies ar,lossless \
             --target "$TARGET" --out "benchmarks/free-drafts-humaneval20-256-$FORMAT-$KIND" ;;
    spec-bench) specdec bench --dataset spec-bench --limit 2 --max-new-tokens 256 --policies ar,lossless \
             --target "$TARGET" --out "benchmarks/free-drafts-spec-bench2-256-$FORMAT-$KIND" ;;
    agent) python scripts/bench_agent_loop.py --target "$TARGET" --configs ar,auto,pld,suffix \
             --out "benchmarks/agent-loop-auto-$FORMAT-$KIND" ;;
    *) echo "unknown workload $w (edits, humaneval, spec-bench, agent)" >&2; exit 2 ;;
  esac
done
