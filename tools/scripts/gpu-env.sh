# Sourced THERE (the GPU machine) by the single-purpose device scripts
# (gpu-ring.sh, gpu-pingpong.sh) from the repo root: C (the carried
# .carry/), OUT, FJ, the unpacked libflashjit.so, a fresh cache directory,
# no autotuning, and nvJitLink from the CUDA toolkit or a pip wheel where
# the loader does not find it.
C=$PWD/.carry
: "${OUT:=$PWD/out}"; mkdir -p "$OUT"
[[ -f $C/lib/libflashjit.so.gz && ! -f $C/lib/libflashjit.so ]] && gzip -dc $C/lib/libflashjit.so.gz > $C/lib/libflashjit.so
chmod +x $C/bin/*
export LD_LIBRARY_PATH=$C/lib FLASHJIT_LIBRARY=$C/lib/libflashjit.so FLASHJIT_AUTOTUNE=0 PYTHONUNBUFFERED=1
export FLASHJIT_CACHE_DIR=$(mktemp -d)
if ! ldconfig -p 2>/dev/null | grep -q 'libnvJitLink\.so\.13' && [[ ! -e /usr/local/cuda/lib64/libnvJitLink.so.13 ]]; then
  sp=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
  export FLASHJIT_NVJITLINK=$(find /usr/local/cuda*/lib64 $sp -name 'libnvJitLink.so.13*' 2>/dev/null | sort | head -1)
fi
FJ=$C/bin/flashjit
