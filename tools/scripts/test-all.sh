#!/usr/bin/env bash
# (b) Set up, build and run every test: GoogleTest (unit, and gpu-labelled
# tests that report "skipped" without a driver) and lit (IR + CLI).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tools/scripts/setup.sh
bash tools/scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
# The Python package: the wheel from ./build, installed into a fresh venv,
# the CPU Python tests against it (about 25 s).
bash tools/scripts/test-wheel.sh
