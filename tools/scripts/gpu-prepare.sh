#!/usr/bin/env bash
# Runs HERE (the CPU machine), before a device call: builds flashjit, then
# assembles the git-ignored carry folder .carry/ that travels with the
# working tree to the GPU machine, where tools/scripts/gpu-run.sh uses it.
#
#   .carry/bin/flashjit                 CLI (RUNPATH $ORIGIN/../lib)
#   .carry/lib/libflashjit.so           stripped (or .so.gz, see below)
#   .carry/lib/_fastcall.abi3.so        the flashjit._fastcall extension
#   .carry/bin/flashjit-*-gpu-tests     GoogleTest binaries under the size cap
#   .carry/bin/flashjit-plan-bench      the C API plan call's micro-benchmark
#   .carry/anchors/anchor_bench.py      the shared peer benchmark
#   .carry/MANIFEST.txt                 what is in here, what was left out
#
# The device copies at most 64 MiB (tracked + untracked-not-ignored files +
# carried paths). We aim under FLASHJIT_CARRY_LIMIT_MIB (default 55); above
# it libflashjit.so is gzipped and gpu-run.sh unpacks it there.
#
# Environment:
#   FLASHJIT_SKIP_BUILD=1          do not run tools/scripts/build.sh
#   FLASHJIT_CARRY_LIMIT_MIB=55    total size goal (MiB)
#   FLASHJIT_TEST_MAX_MIB=20       largest stripped test binary carried (MiB)
#   FLASHJIT_CARRY_GZIP=1          gzip libflashjit.so even under the goal
#
# Then call the device with carry [".carry"] and the command
#   bash tools/scripts/gpu-run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

LIMIT_MIB=${FLASHJIT_CARRY_LIMIT_MIB:-55}
TEST_MAX_MIB=${FLASHJIT_TEST_MAX_MIB:-20}
MiB=$((1024 * 1024))

if [[ "${FLASHJIT_SKIP_BUILD:-0}" != 1 ]]; then
  echo "== build (tools/scripts/build.sh)"
  bash tools/scripts/build.sh
fi

for f in build/bin/flashjit build/lib/libflashjit.so; do
  [[ -f $f ]] || { echo "error: $f is missing; build first" >&2; exit 1; }
done

echo "== assemble .carry/"
rm -rf .carry
mkdir -p .carry/bin .carry/lib .carry/anchors
MANIFEST=.carry/MANIFEST.txt
{
  echo "flashjit carry folder, made $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
} >"$MANIFEST"

strip --strip-unneeded -o .carry/bin/flashjit build/bin/flashjit
strip --strip-unneeded -o .carry/lib/libflashjit.so build/lib/libflashjit.so
# flashjit._fastcall (python/CMakeLists.txt): flashjit/_lib.py looks for it
# beside the library it loads.
[[ -f build/lib/_fastcall.abi3.so ]] &&
  strip --strip-unneeded -o .carry/lib/_fastcall.abi3.so build/lib/_fastcall.abi3.so
if ! readelf -d .carry/bin/flashjit | grep -q 'ORIGIN/../lib'; then
  echo "warning: .carry/bin/flashjit has no \$ORIGIN/../lib RUNPATH;" \
    "gpu-run.sh sets LD_LIBRARY_PATH=.carry/lib as a fallback" >&2
fi

left_out=()
# The C API plan call's micro-benchmark (tests/bench/overhead.py runs it).
if [[ -f build/bin/flashjit-plan-bench ]]; then
  strip --strip-unneeded -o .carry/bin/flashjit-plan-bench build/bin/flashjit-plan-bench
else
  left_out+=("flashjit-plan-bench (not built)")
fi
shopt -s nullglob
tests=(build/bin/flashjit-*-gpu-tests)
shopt -u nullglob
for t in "${tests[@]}"; do
  name=$(basename "$t")
  strip --strip-unneeded -o ".carry/bin/$name" "$t"
  size=$(stat -c %s ".carry/bin/$name")
  if ((size > TEST_MAX_MIB * MiB)); then
    rm -f ".carry/bin/$name"
    left_out+=("$name ($((size / MiB)) MiB stripped > ${TEST_MAX_MIB} MiB)")
  fi
done

# pytest for the Python binding's torch tests (the GPU machine may lack it).
mkdir -p .carry/wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_17_x86_64 -d .carry/wheels \
  pytest pluggy iniconfig packaging >/dev/null 2>&1 ||
  left_out+=("pytest wheels (pip download failed)")

anchors=../shared/anchors/anchor_bench.py
if [[ -f $anchors ]]; then
  cp "$anchors" .carry/anchors/anchor_bench.py
else
  left_out+=("anchor_bench.py (not found at $anchors)")
fi

# Size of everything that travels: tracked files, untracked files git does
# not ignore, and .carry/.
tree_bytes() {
  {
    git ls-files -z --cached
    git ls-files -z --others --exclude-standard
  } | sort -zu | while IFS= read -r -d '' f; do
    [[ -f $f && ! -L $f ]] && stat -c %s "$f"
  done | awk '{s += $1} END {print s + 0}'
}
carry_bytes() { find .carry -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }

tree=$(tree_bytes)
carry=$(carry_bytes)
total=$((tree + carry))
if ((total > LIMIT_MIB * MiB)) || [[ "${FLASHJIT_CARRY_GZIP:-0}" == 1 ]]; then
  echo "total $((total / MiB)) MiB (goal ${LIMIT_MIB} MiB): gzipping libflashjit.so" \
    "(gpu-run.sh unpacks it on the device)"
  gzip -9 -n .carry/lib/libflashjit.so
  carry=$(carry_bytes)
  total=$((tree + carry))
fi

{
  echo
  echo "contents:"
  (cd .carry && find . -type f ! -name MANIFEST.txt -printf '%P\t%s\n' | sort)
  echo
  echo "left out:"
  if ((${#left_out[@]})); then printf '  %s\n' "${left_out[@]}"; else echo "  (nothing)"; fi
  echo
  echo "GLIBC needed: $(objdump -T .carry/bin/* 2>/dev/null | grep -oE 'GLIBC_[0-9.]+' | sort -uV | tail -1)" \
    "(here: $(ldd --version | head -1 | awk '{print $NF}'))"
} >>"$MANIFEST"
[[ -f .carry/lib/libflashjit.so ]] &&
  echo "GLIBC needed by libflashjit.so: $(objdump -T .carry/lib/libflashjit.so | grep -oE 'GLIBC_[0-9.]+' | sort -uV | tail -1)" >>"$MANIFEST"

cat "$MANIFEST"
echo
awk -v t="$tree" -v c="$carry" -v g="$LIMIT_MIB" 'BEGIN {
  m = 1048576
  printf "sizes: tracked+untracked tree %.1f MiB, .carry %.1f MiB, total %.1f MiB (goal < %s MiB, hard limit 64 MiB)\n", t / m, c / m, (t + c) / m, g
}'
if ((total > 64 * MiB)); then
  echo "error: over the device's 64 MiB limit; leave more out" >&2
  exit 1
fi
if ((total > LIMIT_MIB * MiB)); then
  echo "warning: over the ${LIMIT_MIB} MiB goal (but under 64 MiB)" >&2
fi
echo
echo "device call: carry [\".carry\"], command:"
echo "  bash tools/scripts/gpu-run.sh"
echo "  (FLASHJIT_QUICK=1 for a reduced set; FLASHJIT_NCU=1 for the ncu step)"
