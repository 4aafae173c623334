#!/usr/bin/env bash
# T37-7 (carry [".carry"]: this build, and in .carry/old the T37-4 build
# without invariant captured loads; command
# `bash bench/runs/T37-7-prepared.sh`). The document mask (seg ids of
# bench/runs/T37-7-seg8192.npy: 7 documents, 617-1593 tokens), N 8192,
# H 16, d 128, the kernel's own block layout (--mask-blocks): forward and
# backward, old and new library interleaved, two rounds (ms).
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T37-7
gzip -dc $C/old/lib/libflashjit.so.gz > $C/old/lib/libflashjit.so; chmod +x $C/old/bin/flashjit
ms_of() { tail -1 | python3 -c 'import json,sys
try:
  j=json.loads(sys.stdin.read()); print("%.4f%s" % (j["time_ms"], "" if j.get("ok", True) else "!"))
except Exception: print("fail")'; }
A="--head-dim 128 --seq-len 8192 --heads 16 --mask-mod document --capture bench/runs/T37-7-seg8192.npy --mask-blocks --json"
for dir in "" --backward; do
  o=() n=()
  for r in 1 2; do
    o+=($(LD_LIBRARY_PATH=$C/old/lib timeout 60 $C/old/bin/flashjit bench $A $dir 2>$OUT/err.txt | ms_of))
    n+=($(timeout 60 $FJ bench $A $dir 2>>$OUT/err.txt | ms_of))
  done
  say "document ${dir:-forward}: old ${o[*]} | new ${n[*]}"
done
head -c 400 $OUT/err.txt
say done
