#!/usr/bin/env bash
# T34-3 (carry [".carry"]; .carry/old holds 9da284c's libflashjit.so.gz):
# (1) the forward GPU suites (4 shards) and the captured / varlen suites
# on this build (ALiBi's bias split out of the KV loop; d 129..256 on the
# overlapped loop by default); (2) ALiBi, softcap and plain forward, old
# library against new, interleaved; (3) variants.py beside FlexAttention;
# (4) d = 256 beside cuDNN with the new default. Steps skipped near 600 s.
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
python_tests_env
call_header 3
left() { (( SECONDS - CALL_T0 < $1 )); }
gzip -dc $C/old/libflashjit.so.gz > $C/old/libflashjit.so
gt() { local log=$1 bin=$2; shift 2
  env "$@" timeout 200 $C/bin/flashjit-$bin-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/t-$log.log 2>&1
  echo "exit $?" >> $OUT/t-$log.log; }
say "GPU suites"
for i in 0 1 2 3; do gt fwd$i forward GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i & done
gt captured captured & gt varlen varlen &
wait
for l in fwd0 fwd1 fwd2 fwd3 captured varlen; do
  say "$l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-$l.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-$l.log | head -6
done
run_checks 256 "" "--seq-len 777 --seq-len-kv 1333 --batch 2 --heads 4 --gqa 2 --causal" \
  "--seq-len 300 --seq-len-kv 2000 --heads 2 --window 100,0" "--seq-len 1000 --head-dim-v 128"
run_checks 128 "" "--seq-len 1000 --seq-len-kv 3000 --heads 8 --gqa 2 --score-mod alibi:8" \
  "--seq-len 3000 --heads 4 --score-mod alibi:4 --causal" "--seq-len 1 --seq-len-kv 5000 --heads 8 --gqa 4 --score-mod alibi:8"
left 330 && {
say "forward at N 8192 H 16: old library | new (TFLOP/s)"
FLASHJIT_KNOB_ROUNDS=2 timeout 150 bash tools/scripts/gpu-knobs.sh "LD_LIBRARY_PATH=$C/old|-" \
  "--head-dim 128 --seq-len 8192 --score-mod alibi:16" "--head-dim 128 --seq-len 8192 --score-mod alibi:16 --causal" \
  "--head-dim 128 --seq-len 8192" "--head-dim 256 --heads 8" "--head-dim 256 --heads 8 --causal" 2>&1 | tail -5 | cut -c1-200
}
left 420 && {
say "variants beside FlexAttention (ms)"
timeout 120 python3 tests/bench/variants.py --variants plain,alibi,softcap > $OUT/var.log 2>&1
tail -5 $OUT/var.log | cut -c1-170
}
left 500 && {
say "d 256 beside cuDNN"
timeout $((585 - SECONDS + CALL_T0)) python3 tests/bench/side_by_side.py --flashjit $FJ --out $OUT/bench.json --no-backward --no-flex --rounds 2 \
  --cases 256:16384:n,256:16384:c,128:16384:n > $OUT/sbs.log 2>&1
grep -A5 "^side-by-side" $OUT/sbs.log | cut -c1-100
}
rm -f $OUT/t-*.log
say done
