#!/usr/bin/env bash
# The issue-13 headline figures at full size, in the order they are published:
#   1. HumanEval, all 164, greedy, 512 new tokens;
#   2. Spec-Bench, 10 prompts from each of the 13 categories (130), greedy, 256 new tokens;
#   3. HumanEval first 40 sampled (T=0.8, top_p=0.95, seed 0);
#   4. peers (transformers assisted generation, llama.cpp) on HumanEval's first 20.
# Configurations: ar (dtype auto = the fastest measured here), the default lossless
# configuration, each loose rule at its issue-10 tuned setting (mars, dropmatch, fly), and
# typical and fly+mars at their defaults (the issue-10 tuner found no setting of theirs within
# the 1% budget). The tuning split was HumanEval 100..107: those 8 problems are inside the 164,
# so the published figures also give pass@1 without them (README); interim figures of an unfinished
# stage: the same bench command with --report-only.
# Hours on 2 cores. Resumable: `specdec bench` resumes its --out folder sample by sample (every
# configuration on one prompt before the next prompt, so a partial run is a paired comparison at
# its n); rerun this script to continue, commit the folders before stopping.
# Needs nothing else running (timings) and: pip install -e '.[all]'.
# STAGES=1,2 runs some stages only.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGES=${STAGES:-1,2,3,4}
TUNED=(--config benchmarks/issue10-tune-mars/config.json --config benchmarks/issue10-tune-dropmatch/config.json
       --config benchmarks/issue10-tune-fly/config.json)
POLICIES=ar,lossless,typical,fly+mars
run() { specdec bench -q "$@" > /dev/null; }
stage() { [[ ",$STAGES," == *",$1,"* ]]; }
stage 1 && run --dataset humaneval --max-new-tokens 512 --policies "$POLICIES" "${TUNED[@]}" --out benchmarks/issue13-he164
stage 2 && run --dataset spec-bench --limit 10 --max-new-tokens 256 --policies "$POLICIES" "${TUNED[@]}" \
  --out benchmarks/issue13-sb130
stage 3 && run --dataset humaneval --limit 40 --max-new-tokens 512 --temperature 0.8 --top-p 0.95 --seed 0 \
  --policies "$POLICIES" "${TUNED[@]}" --out benchmarks/issue13-he40-t08
stage 4 && run --dataset humaneval --limit 20 --max-new-tokens 512 --policies ar,lossless --peers hf-assisted,llama-cpp \
  --out benchmarks/issue13-he20-peers
exit 0
