#!/usr/bin/env bash
# The tuning figures: mars, fly, dropmatch, typical and fly+mars tuned by `specdec tune` on HumanEval
# 82..163 (the default tuning split) and validated on 0..81 (the default validation split), greedy,
# 512 new tokens, budget 0.02 at one-sided confidence CONFIDENCE (default 0.95), on the llama.cpp
# backend at a fixed K=4 (k=auto drafts nothing on a CPU where wide passes cost ~8x a step, which
# would make every rule plain decoding), default grids with FLy's window at 3 (it must be < K).
# On 2 cores a setting costs ~50 min on the 82 problems, so each policy confirms at most MAX_CONFIRM
# (default 1) settings, fastest proxy first; a policy without a pick has its closest setting
# validated too (--validate-closest), so every row of the table has both halves.
# Folder: benchmarks/tune-humaneval164-512-<kind>[-c<confidence>]; <kind> = avx512bf16 or avx2,
# from /proc/cpuinfo (KIND=... overrides). Resumable: rerun to continue (the stage folders resume;
# the confidence only changes the verdicts, so runs at two confidences share one folder's records).
# Needs nothing else running (timings) and: pip install -e '.[all]'.
set -uo pipefail
cd "$(dirname "$0")/.."
KIND=${KIND:-$(grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && echo avx512bf16 || echo avx2)}
CONFIDENCE=${CONFIDENCE:-0.95}
MAX_CONFIRM=${MAX_CONFIRM:-1}
OUT=${OUT:-benchmarks/tune-humaneval164-512-$KIND}
mkdir -p "$OUT"
START="$OUT/.started-c$CONFIDENCE"
touch "$START"
specdec tune --policy mars,fly,dropmatch,typical,fly+mars --backend llama.cpp --k 4 --grid fly_window=3 \
  --max-new-tokens 512 --max-quality-loss 0.02 --confidence "$CONFIDENCE" \
  --proxy-samples 8 --proxy-tokens 32 --confirm 1 --max-confirm "$MAX_CONFIRM" --validate-closest --out "$OUT" > "$OUT/picks-c$CONFIDENCE.jsonl" \
  2> >(tee "$OUT/tune-c$CONFIDENCE.log" >&2)
rc=$?
# tune.json and report.md are rewritten by each run that finishes: keep this confidence's copies
# (not when this run was stopped before writing them: the files there are another run's)
for f in tune.json report.md; do
  [ "$OUT/$f" -nt "$START" ] && cp "$OUT/$f" "$OUT/${f%.*}-c$CONFIDENCE.${f##*.}"
done
rm -f "$START"
exit $rc
