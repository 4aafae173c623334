#!/usr/bin/env bash
# Installs the Debian packages flashjit builds with, if any are missing.
# Needs root (apt-get); a no-op when everything is there.
set -euo pipefail
packages=(cmake ninja-build g++ ccache python3 lld
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools libzstd-dev zlib1g-dev
  libgtest-dev googletest libfmt-dev clang libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q "${missing[@]}"
fi
# The Python binding's tests: numpy and pytest for the python3 on PATH.
if ! python3 -c "import numpy, pytest" 2>/dev/null; then
  echo "setup: installing numpy and pytest for $(command -v python3)"
  python3 -m pip install -q numpy pytest 2>/dev/null ||
    python3 -m pip install -q --break-system-packages numpy pytest
fi
if [[ ! -f /usr/local/cuda/include/cuda.h ]]; then
  echo "setup: warning: /usr/local/cuda/include/cuda.h not found (CUDA 13" \
       "toolkit headers are needed to build the runtime)" >&2
fi
