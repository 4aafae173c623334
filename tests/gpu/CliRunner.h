//===- CliRunner.h - Run the flashjit binary from a GPU test ----*- C++ -*-===//
//
/// \file
/// The GPU tests drive libflashjit.so through the flashjit binary (one copy
/// of LLVM on the GPU machine): find it, run it, read its JSON line.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_TESTS_GPU_CLIRUNNER_H
#define FLASHJIT_TESTS_GPU_CLIRUNNER_H

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace flashjit::test {

/// The flashjit binary: $FLASHJIT_BIN, else beside this test executable.
inline std::string flashjitBinary() {
  if (const char *env = std::getenv("FLASHJIT_BIN"))
    return env;
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string path(self, n > 0 ? size_t(n) : 0);
  return path.substr(0, path.rfind('/') + 1) + "flashjit";
}

struct CliResult {
  int exitCode = -1;
  std::string out; ///< stdout
};

/// Runs `[env] flashjit ARGS` and collects stdout (stderr is dropped).
inline CliResult runFlashjit(const std::string &args,
                             const std::string &env = "") {
  std::string cmd = env + (env.empty() ? "" : " ") + flashjitBinary() + " " +
                    args + " 2>/dev/null";
  CliResult r;
  FILE *pipe = popen(cmd.c_str(), "r");
  if (!pipe)
    return r;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe))
    r.out.append(buf.data(), n);
  int status = pclose(pipe);
  r.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

/// The number after "key": in a one-line JSON object, searching from
/// \p from (NaN if absent).
inline double jsonNumber(const std::string &json, const std::string &key,
                         size_t from = 0) {
  auto at = json.find("\"" + key + "\":", from);
  if (at == std::string::npos)
    return std::nan("");
  return std::strtod(json.c_str() + at + key.size() + 3, nullptr);
}

} // namespace flashjit::test

#endif // FLASHJIT_TESTS_GPU_CLIRUNNER_H
