#!/usr/bin/env bash
# The Python package end to end: builds the wheel (pyproject.toml,
# scikit-build-core) from the existing ./build tree, installs it into a fresh
# venv and runs the CPU Python tests against the installed package (the
# library it bundles, no FLASHJIT_LIBRARY, the checkout's python/ not on the
# path). CI runs it after ctest (tools/scripts/test-all.sh).
#
# Why ./build: a wheel build in a build dir of its own compiles all of the
# C++ again (ccache cannot serve it: -I<build dir> differs; 10.5 min here
# against 4 min allowed), while -C build-dir=build reconfigures the tree
# ctest just used (FLASHJIT_TESTS=ON given, so it keeps its tests), finds
# libflashjit.so up to date and only installs it (component python) into
# the wheel: seconds.
#
# Environment: FLASHJIT_WHEEL_BUILD_DIR (default build), PYTHON (python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-python3}
BUILD=${FLASHJIT_WHEEL_BUILD_DIR:-build}
[[ -f $BUILD/CMakeCache.txt ]] || { echo "test-wheel: $BUILD is not configured; run tools/scripts/build.sh" >&2; exit 1; }
T0=$SECONDS
say() { echo "[test-wheel +$((SECONDS - T0))s] $*"; }

# The build venv (kept in the build dir): scikit-build-core, no isolation,
# so a second run downloads nothing.
BV=$BUILD/wheel-build-venv
if ! "$BV/bin/python" -c "import scikit_build_core" 2>/dev/null; then
  say "build venv $BV (scikit-build-core)"
  "$PY" -m venv --clear "$BV"
  "$BV/bin/pip" install -q "scikit-build-core>=0.10"
fi
DIST=$BUILD/dist
rm -rf "$DIST"
say "pip wheel . (build-dir=$BUILD)"
"$BV/bin/pip" wheel -q . -w "$DIST" --no-deps --no-build-isolation \
  -C build-dir="$BUILD" -C cmake.define.FLASHJIT_TESTS=ON
wheel=$(ls "$DIST"/flashjit-*.whl)
say "built $(basename "$wheel") ($(($(stat -c %s "$wheel") / 1048576)) MiB)"
"$PY" - "$wheel" <<'PYEOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["flashjit/__init__.py", "flashjit/_lib.py", "flashjit/ops.py",
        "flashjit/libflashjit.so", "flashjit/_fastcall.abi3.so"]
missing = [n for n in need if n not in names]
if missing:
    sys.exit(f"test-wheel: the wheel lacks {missing}: {names}")
PYEOF

# A fresh venv (numpy and pytest from the system's site-packages), the
# wheel installed into it, the tests run from outside the checkout.
TV=$(mktemp -d /tmp/flashjit-wheel-test.XXXXXX)
trap 'rm -rf "$TV"' EXIT
"$PY" -m venv --system-site-packages "$TV/venv"
"$TV/venv/bin/pip" install -q --no-deps --no-index "$wheel"
say "installed into a fresh venv"
cd "$TV"
env -u FLASHJIT_LIBRARY -u PYTHONPATH "$TV/venv/bin/python" - <<'PYEOF'
import pathlib, flashjit
pkg = pathlib.Path(flashjit.__file__).resolve().parent
lib = pathlib.Path(flashjit.library_path()).resolve()
assert "site-packages" in str(pkg), pkg
assert lib.parent == pkg, f"library {lib} is not the bundled one ({pkg})"
print(f"import flashjit: {pkg}, library {lib.name} beside it, version {flashjit.version()}")
PYEOF
env -u FLASHJIT_LIBRARY -u PYTHONPATH FLASHJIT_TEST_INSTALLED=1 \
  "$TV/venv/bin/python" -m pytest -q -p no:cacheprovider \
  "$ROOT/python/tests/test_cpu.py" "$ROOT/python/tests/test_bad_inputs.py" \
  "$ROOT/python/tests/test_varlen_cpu.py" \
  "$ROOT/python/tests/test_fastcall_cpu.py"
say "ok"
