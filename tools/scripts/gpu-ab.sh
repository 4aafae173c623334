#!/usr/bin/env bash
# Runs THERE (the GPU machine): times two flashjit builds on the same cases
# in one run, interleaved (A B A B ...), so that a change is measured
# against its base on the same card, clocks and temperature.
#
#   A = .carry/bin/flashjit        (this tree, from tools/scripts/gpu-prepare.sh)
#   B = .carry/ab/bin/flashjit     (the base: copy a stripped build's
#                                   bin/flashjit and lib/libflashjit.so there)
#
# Usage: bash tools/scripts/gpu-ab.sh [CASE ...]
#   CASE = "flashjit bench" flags, quoted, e.g. "--backward --head-dim 64";
#   default: the backward at d = 64, 96, 128 (+ causal) and 256, B*N = 16K.
# Environment: FLASHJIT_AB_ROUNDS (default 3) rounds per build and case;
# the problem is --batch 1 --heads 16 --seq-len 16384 unless a case says.
# Prints one line per case: A and B median-of-rounds TFLOP/s and A/B.
set -u
cd "$(dirname "$0")/../.." || exit 2
A=.carry/bin/flashjit
B=.carry/ab/bin/flashjit
for f in "$A" "$B"; do
  [[ -x $f ]] || { echo "gpu-ab: $f is missing" >&2; exit 2; }
done
rounds=${FLASHJIT_AB_ROUNDS:-3}
problem="--batch 1 --heads 16 --seq-len 16384"
cases=("$@")
if ((${#cases[@]} == 0)); then
  cases=("--backward --head-dim 64" "--backward --head-dim 96"
         "--backward --head-dim 128" "--backward --head-dim 128 --causal"
         "--backward --head-dim 256")
fi

# Each build its own cubin cache: neither reads the other's entries.
cache=$(mktemp -d /tmp/flashjit-ab.XXXXXX)

# The TFLOP/s of one `flashjit bench --json` run of build $1, or "fail".
tflops() {
  local root
  root=$(dirname "$(dirname "$1")")
  # Each build with its own libflashjit.so (LD_LIBRARY_PATH wins over the
  # binary's RUNPATH).
  LD_LIBRARY_PATH=$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
    FLASHJIT_CACHE_DIR=$cache/$(basename "$root") "$1" bench $problem $2 --json 2>/dev/null |
    python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["tflops"])' \
      2>/dev/null || echo fail
}

# The median of its arguments (numbers), or "fail" when there are none.
median() {
  printf '%s\n' "$@" | grep -v fail | sort -g |
    awk '{v[NR]=$1} END {if (NR==0) print "fail"; else print v[int((NR+1)/2)]}'
}

printf '%-44s %10s %10s %8s\n' "case" "A TFLOP/s" "B TFLOP/s" "A/B"
for c in "${cases[@]}"; do
  a=() b=()
  for ((r = 0; r < rounds; ++r)); do
    a+=("$(tflops "$A" "$c")")
    b+=("$(tflops "$B" "$c")")
  done
  ma=$(median "${a[@]}") mb=$(median "${b[@]}")
  ratio=$(python3 -c "print(f'{$ma/$mb:.3f}')" 2>/dev/null || echo "-")
  printf '%-44s %10s %10s %8s   (A: %s; B: %s)\n' "$c" "$ma" "$mb" "$ratio" \
    "${a[*]}" "${b[*]}"
done
