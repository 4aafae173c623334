#!/usr/bin/env bash
# Configures and builds flashjit into ./build (Release, Ninja, ccache).
set -euo pipefail
cd "$(dirname "$0")/../.."
# The libFuzzer target (tests/fuzz, 20 s under ctest) needs clang++.
fuzz=${FLASHJIT_FUZZ:-$(command -v clang++ >/dev/null && echo ON || echo OFF)}
cmake -S . -B build -G Ninja -DCMAKE_PREFIX_PATH=/usr/lib/llvm-22 \
  -DFLASHJIT_FUZZ="$fuzz"
cmake --build build -j "${FLASHJIT_JOBS:-$(nproc)}"
