# lit configuration for flashjit: IR tests (flashjit-opt + FileCheck) and
# CLI tests (flashjit + FileCheck).
import os
import lit.formats

config.name = "flashjit"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".mlir", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.flashjit_bin_dir, "..", "tests", "lit-out")
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py.in", "Inputs"]

path = [config.flashjit_bin_dir, config.llvm_tools_dir, config.environment.get("PATH", "")]
config.environment["PATH"] = os.pathsep.join(path)
# Keep the runs deterministic in what they print: no GPU probing surprises.
config.environment["FLASHJIT_LIBCUDA"] = "/nonexistent/libcuda.so.1"
# Never touch the user's cache from tests.
config.environment["FLASHJIT_CACHE_DIR"] = os.path.join(config.test_exec_root, "cache")
# %flashjit_lib first: lit substitutes in order, and %flashjit is its prefix.
config.substitutions.append(("%flashjit_lib", os.path.join(config.flashjit_bin_dir, "..", "lib", "libflashjit.so")))
config.substitutions.append(("%flashjit", os.path.join(config.flashjit_bin_dir, "flashjit")))
config.substitutions.append(("%inputs", os.path.join(config.test_source_root, "Inputs")))
