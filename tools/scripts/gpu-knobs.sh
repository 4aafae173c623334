#!/usr/bin/env bash
# Runs THERE (the GPU machine): times one flashjit build under several
# environment settings (the FLASHJIT_* knobs that are part of the pipeline
# text: FLASHJIT_PING_PONG, FLASHJIT_PERSISTENT, FLASHJIT_TMA, ...) on the
# same cases, interleaved (knob 1, knob 2, ... then the next round), so that
# the knobs are compared on the same card, clocks and temperature. Each
# setting compiles its own kernels (the knobs are in the cache key).
#
# Usage: bash tools/scripts/gpu-knobs.sh KNOBS CASE ...
#   KNOBS  the settings, separated by "|", each a space-separated list of
#          VAR=VALUE ("-" for none): e.g. "-|FLASHJIT_PERSISTENT=1"; from
#          its first word that starts with "--" on, a setting's words are
#          "flashjit bench" flags added after the case's (a tiling to
#          compare: "-|--block-n 176 --overlap-softmax")
#   CASE   "flashjit bench" flags, quoted, e.g. "--head-dim 128 --causal";
#          the problem is --batch 1 --heads 16 --seq-len 16384 unless a
#          case says (later flags win).
# Environment: FLASHJIT_KNOB_ROUNDS (default 3); FLASHJIT_KNOB_BIN (default
# .carry/bin/flashjit).
# Prints one line per case: each setting's median TFLOP/s (its rounds in
# brackets) and its ratio to the first setting's median.
set -u
cd "$(dirname "$0")/../.." || exit 2
if (($# < 2)); then
  echo "usage: gpu-knobs.sh 'KNOB|KNOB...' CASE ..." >&2
  exit 2
fi
bin=${FLASHJIT_KNOB_BIN:-.carry/bin/flashjit}
[[ -x $bin ]] || { echo "gpu-knobs: $bin is missing" >&2; exit 2; }
IFS='|' read -r -a knobs <<<"$1"
shift
rounds=${FLASHJIT_KNOB_ROUNDS:-3}
problem="--batch 1 --heads 16 --seq-len 16384"
cache=$(mktemp -d /tmp/flashjit-knobs.XXXXXX)

# The TFLOP/s of one `flashjit bench --json` run under knob $1, case $2.
tflops() {
  local words=() settings=() flags=()
  [[ $1 != "-" ]] && read -r -a words <<<"$1"
  for w in "${words[@]}"; do
    if ((${#flags[@]})) || [[ $w == --* ]]; then flags+=("$w"); else settings+=("$w"); fi
  done
  # shellcheck disable=SC2086 # the problem and the case are flag lists
  env "${settings[@]}" FLASHJIT_CACHE_DIR="$cache" "$bin" bench $problem $2 "${flags[@]}" --json \
    2>/dev/null |
    python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["tflops"])' \
      2>/dev/null || echo fail
}

# The median of its arguments (numbers), or "fail" when there are none.
median() {
  printf '%s\n' "$@" | grep -v fail | sort -g |
    awk '{v[NR]=$1} END {if (NR==0) print "fail"; else print v[int((NR+1)/2)]}'
}

echo "knobs: $(printf '[%s] ' "${knobs[@]}")"
for c in "$@"; do
  declare -A got=()
  for ((r = 0; r < rounds; ++r)); do
    for k in "${!knobs[@]}"; do
      got[$k]+=" $(tflops "${knobs[$k]}" "$c")"
    done
  done
  line=$(printf '%-44s' "$c")
  # shellcheck disable=SC2086 # the rounds are words
  first=$(median ${got[0]})
  for k in "${!knobs[@]}"; do
    # shellcheck disable=SC2086
    m=$(median ${got[$k]})
    ratio=$(python3 -c "print(f'{$m/$first:.3f}')" 2>/dev/null || echo "-")
    line+=" | $m x$ratio (${got[$k]# })"
  done
  echo "$line"
  unset got
done
rm -rf "$cache"
