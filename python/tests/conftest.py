# Makes `import flashjit` find python/flashjit when pytest runs from anywhere,
# except with FLASHJIT_TEST_INSTALLED=1 (tools/scripts/test-wheel.sh): then the
# installed package (pip install .) is tested, and must be the one imported.
import os
import pathlib
import sys

_PYTHON_DIR = pathlib.Path(__file__).resolve().parents[1]

if os.environ.get("FLASHJIT_TEST_INSTALLED") == "1":
    import flashjit

    where = pathlib.Path(flashjit.__file__).resolve().parent
    if where == _PYTHON_DIR / "flashjit":
        raise RuntimeError(
            f"FLASHJIT_TEST_INSTALLED=1 but flashjit was imported from the "
            f"checkout ({where}), not from an installed package")
    if os.environ.get("FLASHJIT_LIBRARY"):
        raise RuntimeError("FLASHJIT_TEST_INSTALLED=1: unset FLASHJIT_LIBRARY "
                           "(the installed package must find its own library)")
else:
    sys.path.insert(0, str(_PYTHON_DIR))
