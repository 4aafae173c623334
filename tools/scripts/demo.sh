#!/usr/bin/env bash
# (a) Set up, build and run the main job: compile a head-dim-96 causal
# attention, show its tile IR, and run it against the float64 reference
# (on the GPU when one is found, else on the CPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tools/scripts/setup.sh
bash tools/scripts/build.sh
./build/bin/flashjit compile --head-dim 96 --causal --emit tile
./build/bin/flashjit run --head-dim 96 --causal --seq-len 1000 --heads 4
