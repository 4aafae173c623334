#!/usr/bin/env bash
# Configures and builds flashjit into ./build (Release, Ninja, ccache).
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build -G Ninja -DCMAKE_PREFIX_PATH=/usr/lib/llvm-22
cmake --build build -j "${FLASHJIT_JOBS:-$(nproc)}"
