#!/usr/bin/env bash
# Runs THERE (the GPU machine), from the repo root: checks a candidate
# build against a base in one call, its output compact (the device returns
# only the last 12,000 characters). Prepare HERE:
#
#   FLASHJIT_SKIP_BUILD=1 bash tools/scripts/gpu-prepare.sh   # candidate
#   mkdir -p .carry/ab/bin .carry/ab/lib                       # the base:
#   strip -o .carry/ab/bin/flashjit BASE/bin/flashjit          # its CLI and
#   strip -o .carry/ab/lib/libflashjit.so BASE/lib/libflashjit.so
#   gzip .carry/ab/lib/libflashjit.so                          # (size cap)
#
# then call the device with carry [".carry"] and
#   bash tools/scripts/gpu-candidate.sh
#
# Steps (FLASHJIT_CANDIDATE_STEPS, default tests,sanitize,ab,profile):
#   tests     the forward suite in four shards beside the captured and
#             varlen suites (FLASHJIT_CANDIDATE_TEST_S, default 140 s)
#   sanitize  racecheck and memcheck on two overlapped-loop kernels,
#             synccheck on one
#   ab        tools/scripts/gpu-ab.sh (FLASHJIT_AB_ROUNDS, default two
#             rounds) on issue 13's d = 128 shapes: N 16K plain and causal,
#             N 1024 B 16 plain and causal, N 4096 B 4; or on the cases of
#             FLASHJIT_CANDIDATE_CASES ("CASE|CASE...", each gpu-ab.sh's)
#   profile   tools/scripts/gpu-ab-profile.sh on the causal N 16K forward
set -u
cd "$(dirname "$0")/../.." || exit 2
if [[ -f .carry/ab/lib/libflashjit.so.gz && ! -f .carry/ab/lib/libflashjit.so ]]; then
  gzip -dc .carry/ab/lib/libflashjit.so.gz >.carry/ab/lib/libflashjit.so
fi
chmod +x .carry/ab/bin/* 2>/dev/null
source tools/scripts/gpu-env.sh
steps=${FLASHJIT_CANDIDATE_STEPS:-tests,sanitize,ab,profile}
has() { [[ ",$steps," == *",$1,"* ]]; }
T0=$SECONDS
say() { echo "[candidate +$((SECONDS - T0))s] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "candidate: $(sed -n 2p .carry/MANIFEST.txt)"

if has tests; then
  limit=${FLASHJIT_CANDIDATE_TEST_S:-140}
  suite() { # LOG BINARY [ENV...]
    local log=$1 bin=$2
    shift 2
    env "$@" timeout "$limit" "$C/bin/flashjit-$bin-gpu-tests" --gtest_brief=1 \
      --gtest_color=no >"$OUT/t-$log.log" 2>&1
    echo "exit $?" >>"$OUT/t-$log.log"
  }
  for i in 0 1 2 3; do
    suite "fwd$i" forward GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i &
  done
  suite captured captured &
  suite varlen varlen &
  wait
  for l in fwd0 fwd1 fwd2 fwd3 captured varlen; do
    say "$l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' "$OUT/t-$l.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \] [A-Z]' "$OUT/t-$l.log" | head -4
  done
  rm -f "$OUT"/t-*.log
fi

W="--block-m 128 --block-n 128 --warps 8 --overlap-softmax"
if has sanitize; then
  sanitize "racecheck memcheck" \
    "--head-dim 128 $W --causal --seq-len 300 --seq-len-kv 333 --json" \
    "--head-dim 128 $W --score-mod softcap:30 --seq-len 200 --json"
  sanitize synccheck "--head-dim 128 $W --seq-len 260 --json"
  rm -f "$OUT/san.log"
fi

if has ab; then
  say "A/B (A = candidate, B = .carry/ab), TFLOP/s"
  cases=("--head-dim 128" "--head-dim 128 --causal"
         "--head-dim 128 --seq-len 1024 --batch 16"
         "--head-dim 128 --seq-len 1024 --batch 16 --causal"
         "--head-dim 128 --seq-len 4096 --batch 4")
  [[ -n ${FLASHJIT_CANDIDATE_CASES:-} ]] &&
    IFS='|' read -r -a cases <<<"$FLASHJIT_CANDIDATE_CASES"
  FLASHJIT_AB_ROUNDS=${FLASHJIT_AB_ROUNDS:-2} timeout 240 \
    bash tools/scripts/gpu-ab.sh "${cases[@]}" 2>&1 | tail -$((${#cases[@]} + 1))
fi

if has profile; then
  say "ncu, one launch each (ratios only)"
  timeout 200 bash tools/scripts/gpu-ab-profile.sh "--head-dim 128 --causal" 2>&1 | tail -3
fi
say done
