#!/usr/bin/env bash
# the README's first command from nothing, in two timed halves: install, then the first generate
set -u
OUT=/tmp/fr/out; rm -rf $OUT /tmp/fr/specdec /tmp/fr/home; mkdir -p $OUT
git clone -q /work/main /tmp/fr/specdec && cd /tmp/fr/specdec
export PIP_NO_CACHE_DIR=1 SPECDEC_HOME=/tmp/fr/home
lscpu > $OUT/lscpu.txt
date -u +%FT%TZ > $OUT/started.txt
/usr/bin/time -v -o $OUT/install-time-v.txt bash -c "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && CMAKE_BUILD_PARALLEL_LEVEL=\$(nproc) pip install -e '.[models,llama]'" > $OUT/install-printout.txt 2>&1
echo "install rc=$?" >> $OUT/install-printout.txt
/usr/bin/time -v -o $OUT/generate-time-v.txt .venv/bin/specdec generate "Write a Python function that checks whether a number is prime." > $OUT/generate-printout.txt 2>&1
echo "generate rc=$?" >> $OUT/generate-printout.txt
/usr/bin/time -v -o $OUT/second-generate-time-v.txt .venv/bin/specdec generate "Write a Python function that checks whether a number is prime." > $OUT/second-generate-printout.txt 2>&1
date -u +%FT%TZ > $OUT/finished.txt
touch $OUT/DONE
