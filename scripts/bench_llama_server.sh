#!/usr/bin/env bash
# The default beside llama.cpp's own server (pip install xllamacpp: its prebuilt wheel) on the same
# shipped Q4_K_M file, greedy, each workload one folder under benchmarks/ named with KIND (this
# machine's kind) and rerunning resumes: the edits and HumanEval/Spec-Bench through `specdec bench`
# (--peers llama-server,...), the edit session and the agent loop through the OpenAI client.
# Nothing else may run on the machine meanwhile (speed figures).
#
#   KIND=xeon bash scripts/bench_llama_server.sh
#   KIND=xeon WORKLOADS="session edits" EDITS=6 bash scripts/bench_llama_server.sh
#
# The llama.cpp server modes beside each workload: MODES beside the edits (default: all four),
# SESSION_MODES beside the session and CODE_MODES beside HumanEval and Spec-Bench (default: plain and
# ngram-mod); SUFFIX: appended to each folder's name (a second run beside an earlier one).
set -euo pipefail
cd "$(dirname "$0")/.."
KIND=${KIND:?name this machine kind: KIND=avx2, avx512bf16, xeon, ...}
WORKLOADS=${WORKLOADS:-"session edits agent humaneval spec-bench"}
EDITS=${EDITS:-20}
HUMANEVAL=${HUMANEVAL:-20}
SPECBENCH=${SPECBENCH:-2}
MODES=${MODES:-llama-server,llama-server-ngram-mod,llama-server-ngram-simple,llama-server-ngram-map-k}
CODE_MODES=${CODE_MODES:-llama-server,llama-server-ngram-mod}
SESSION_MODES=${SESSION_MODES:-llama-server,llama-server-ngram-mod}
SUFFIX=${SUFFIX:-}
for w in $WORKLOADS; do
  case $w in
    session) python scripts/bench_edit_session.py --configs "default,ar,$SESSION_MODES" \
               --out "benchmarks/edit-session-q4_k_m-$KIND$SUFFIX" ;;
    edits) specdec bench --dataset edits --limit "$EDITS" --max-new-tokens 512 --policies ar,lossless --peers "$MODES" \
             --out "benchmarks/edits$EDITS-512-q4_k_m-$KIND-llama-server$SUFFIX" ;;
    agent) python scripts/bench_agent_loop.py --configs ar,auto,llama-server,llama-server-ngram-mod \
             --out "benchmarks/agent-loop-q4_k_m-$KIND-llama-server$SUFFIX" ;;
    humaneval) specdec bench --dataset humaneval --limit "$HUMANEVAL" --max-new-tokens 256 --policies ar,lossless \
             --peers "$CODE_MODES" --out "benchmarks/humaneval$HUMANEVAL-256-q4_k_m-$KIND-llama-server$SUFFIX" ;;
    spec-bench) specdec bench --dataset spec-bench --limit "$SPECBENCH" --max-new-tokens 256 --policies ar,lossless \
             --peers "$CODE_MODES" --out "benchmarks/spec-bench$SPECBENCH-256-q4_k_m-$KIND-llama-server$SUFFIX" ;;
    *) echo "unknown workload $w (session, edits, agent, humaneval, spec-bench)" >&2; exit 2 ;;
  esac
done
