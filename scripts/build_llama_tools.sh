#!/usr/bin/env bash
# Build llama.cpp's own draft-model speculative decoding example, llama-speculative-simple, from
# the llama.cpp source that the llama-cpp-python sdist vendors (the same llama.cpp version that
# the llama-cpp peer runs through the Python binding), so it can be benchmarked as a peer.
#
#   scripts/build_llama_tools.sh [OUT_DIR] [SDIST]
#
# OUT_DIR  where the binary goes (default ${SPECDEC_HOME:-~/.cache/specdec}/llama-tools);
#          specdec.bench.running.llama_tools.find_tool looks there.
# SDIST    llama_cpp_python-<version>.tar.gz; without it (or $LLAMA_SDIST) it is fetched with
#          pip download --no-deps --no-binary :all: llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION
#          (default 0.3.36) into a temporary folder.
# Env: JOBS (default 2), PYTHON (for pip; default python3), FORCE=1 rebuilds even when the
#      binary is already there, KEEP_BUILD=1 keeps the temporary build folder.
#
# Only the llama-speculative-simple target is built: Release, static (BUILD_SHARED_LIBS=OFF, so
# the binary needs no libllama/libggml next to it), GGML_NATIVE=ON (tuned to this CPU: rebuild
# on another machine kind), no curl/openssl, no tests/server/tools/app. About 11 minutes on
# 2 cores. Idempotent: does nothing when OUT_DIR already holds the binary.
set -euo pipefail

VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
TARGETS=(llama-speculative-simple)
OUT=${1:-${SPECDEC_HOME:-$HOME/.cache/specdec}/llama-tools}
SDIST=${2:-${LLAMA_SDIST:-}}
JOBS=${JOBS:-2}
PYTHON=${PYTHON:-python3}

die() { echo "build_llama_tools.sh: error: $*" >&2; exit 1; }

missing=()
for t in "${TARGETS[@]}"; do [[ -x "$OUT/$t" ]] || missing+=("$t"); done
if [[ ${#missing[@]} -eq 0 && "${FORCE:-0}" != 1 ]]; then
  echo "build_llama_tools.sh: already built: ${TARGETS[*]/#/$OUT/} (FORCE=1 to rebuild)"
  exit 0
fi

command -v cmake >/dev/null || die "cmake not found (apt-get install cmake, or pip install cmake)"
command -v c++ >/dev/null || command -v g++ >/dev/null || command -v clang++ >/dev/null \
  || die "no C++ compiler found (apt-get install build-essential)"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/specdec-llama-tools.XXXXXX")
cleanup() { if [[ "${KEEP_BUILD:-0}" == 1 ]]; then echo "build folder kept: $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

if [[ -z "$SDIST" ]]; then
  echo "build_llama_tools.sh: downloading the llama-cpp-python==$VERSION source distribution"
  "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK/dl" \
    || die "pip download of llama-cpp-python==$VERSION failed; pass the sdist path as the second argument"
  SDIST=$(ls "$WORK"/dl/llama_cpp_python-*.tar.gz 2>/dev/null | head -n1)
  [[ -n "$SDIST" ]] || die "pip download produced no llama_cpp_python-*.tar.gz"
fi
[[ -f "$SDIST" ]] || die "sdist not found: $SDIST"

echo "build_llama_tools.sh: unpacking $SDIST"
mkdir -p "$WORK/src"
tar -xzf "$SDIST" -C "$WORK/src" || die "could not unpack $SDIST"
LLAMA_SRC=$(ls -d "$WORK"/src/*/vendor/llama.cpp 2>/dev/null | head -n1)
[[ -n "$LLAMA_SRC" && -f "$LLAMA_SRC/CMakeLists.txt" ]] || die "no vendor/llama.cpp/CMakeLists.txt in $SDIST"
[[ -f "$LLAMA_SRC/examples/speculative-simple/speculative-simple.cpp" ]] \
  || die "this llama.cpp has no examples/speculative-simple"

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
BUILD="$WORK/build"
start=$(date +%s)
echo "build_llama_tools.sh: configuring ($LLAMA_SRC)"
cmake -S "$LLAMA_SRC" -B "$BUILD" "${GEN[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_COMMON=ON \
  -DLLAMA_BUILD_EXAMPLES=ON \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_TOOLS=OFF \
  -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_APP=OFF \
  >"$WORK/configure.log" 2>&1 \
  || { tail -n 40 "$WORK/configure.log" >&2; die "cmake configure failed (log above)"; }

echo "build_llama_tools.sh: building ${TARGETS[*]} with $JOBS jobs"
cmake --build "$BUILD" --config Release -j "$JOBS" --target "${TARGETS[@]}" >"$WORK/build.log" 2>&1 \
  || { tail -n 60 "$WORK/build.log" >&2; die "cmake build failed (log above)"; }
end=$(date +%s)

mkdir -p "$OUT" || die "cannot create $OUT"
for t in "${TARGETS[@]}"; do
  bin=$(find "$BUILD" -type f -name "$t" -perm -u+x | head -n1)
  [[ -n "$bin" ]] || die "the build produced no $t binary"
  cp -f "$bin" "$OUT/$t.tmp" && mv -f "$OUT/$t.tmp" "$OUT/$t" || die "could not copy $t to $OUT"
done
echo "llama.cpp from llama-cpp-python $(basename "$SDIST"), built $(date -u +%Y-%m-%dT%H:%M:%SZ) in $((end - start)) s" \
  >"$OUT/BUILD_INFO"
echo "build_llama_tools.sh: built ${TARGETS[*]} in $((end - start)) s -> $OUT"
