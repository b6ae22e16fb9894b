#!/usr/bin/env bash
# Drafters that need no draft model (prompt lookup, suffix decoding, lookahead decoding) against plain
# decoding on the llama.cpp backend, no draft model loaded: HumanEval first 20 and Spec-Bench 2 per
# category, 256 new tokens, greedy, k=auto (scripts/bench_cpu_formats.sh with DRAFT=none). One folder
# per (dataset, target format) under benchmarks/drafters-*, named with this machine's kind;
# rerunning resumes. Nothing else may run on the machine meanwhile (speed figures).
#
#   bash scripts/bench_drafters_no_model.sh                              # bf16 and q4_k_m, both datasets
#   FORMATS=bf16 DATASETS=humaneval bash scripts/bench_drafters_no_model.sh
#   POLICIES=ar,lossless:drafter=lookahead SUFFIX=-lookahead-probe-credit DATASETS=humaneval bash scripts/bench_drafters_no_model.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=drafters DRAFT=none FORMATS=${FORMATS:-"bf16 q4_k_m"} \
  POLICIES=${POLICIES:-"ar,lossless:drafter=pld,lossless:drafter=suffix,lossless:drafter=lookahead"} \
  exec bash scripts/bench_cpu_formats.sh
