//===- FuzzInputs.cpp - libFuzzer target: CLI flags and layout files ------===//
//
/// \file
/// A libFuzzer target over what a user types or hands flashjit: the CLI's
/// argument parser (with the shared size, scale and window checks behind
/// it) and the layout file reader (with checkFits and the backward's
/// transpose). The property: every input either parses into options that
/// pass the checks, or throws a SpecError with a message; any other
/// exception, a crash, a sanitizer report or a hang is a finding.
///
/// Input: the first byte picks the mode (even: argv, odd: layout text); the
/// rest is newline-separated argv words, or a layout file's bytes.
/// Built only with -DFLASHJIT_FUZZ=ON (tests/fuzz/CMakeLists.txt).
//
//===----------------------------------------------------------------------===//

#include "kernels/AttentionSpec.h"
#include "kernels/HostTensor.h"
#include "tools/cli/CliOptions.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <unistd.h>

using namespace flashjit;

/// The fuzz target links the CLI's parser without the compiler (no MLIR):
/// `--input FILE` reads the file (bounded, fuzzed like the layout reader)
/// and then meets this stand-in, which refuses it as invalid IR would.
SourceInfo flashjit::inspectSource(const KernelSource &source) {
  throw CompileError(source.name + ": not compiled in the fuzz target");
}
/// A --score-mod region: refused as a region that does not parse would be.
AttentionSpec flashjit::withScoreModRegion(const AttentionSpec &,
                                           const std::string &) {
  throw SpecError("score_mod region: not compiled in the fuzz target");
}
/// A --mask-mod region (or document): refused the same way.
AttentionSpec flashjit::withMaskModRegion(const AttentionSpec &,
                                          const std::string &) {
  throw SpecError("mask_mod region: not compiled in the fuzz target");
}
/// (Never reached: inspectSource refuses every file first.)
KernelSource flashjit::forwardSourceOf(const KernelSource &backward) {
  throw CompileError(backward.name + ": not compiled in the fuzz target");
}

namespace {

/// Aborts (a libFuzzer finding) unless \p ok.
void require(bool ok, const char *what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
    std::abort();
  }
}

void fuzzArgv(const std::string &text) {
  std::vector<std::string> words;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i)
    if (i == text.size() || text[i] == '\n') {
      words.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  std::vector<const char *> argv{"flashjit"};
  for (const std::string &w : words)
    argv.push_back(w.c_str());
  cli::CliOptions o;
  try {
    o = cli::parseCommandLine(int(argv.size()), argv.data());
  } catch (const SpecError &e) {
    require(e.what()[0] != '\0', "an empty error message");
    return;
  }
  // --help and --version print and exit: the rest of the line is not
  // validated (as the CLI does).
  if (o.help || o.version)
    return;
  (void)o.spec.name();
  (void)o.spec.toJson();
  (void)o.config.toJson();
  if (o.command == "compile" || o.command == "cache" || o.command.empty() ||
      o.command == "help")
    return;
  // Accepted: the problem is within the shared limits.
  checkProblemSize(o.spec, o.problem); // must not throw
  double scale = o.problem.effectiveScale(o.spec);
  require(scale >= kMinScale && scale <= kMaxScale, "scale out of bounds");
  (void)o.problem.toJson(o.spec);
  // A random layout, when it is small enough to draw here.
  if (o.spec.blockSparse && o.layoutPath.empty()) {
    int64_t sb = o.spec.sparseBlock;
    double cells = double(o.problem.batch) * double(o.problem.heads) *
                   double((o.problem.seqLenQ + sb - 1) / sb) *
                   double((o.problem.seqLenKV + sb - 1) / sb);
    if (cells <= double(1 << 16)) {
      try {
        (void)cli::layoutFromOptions(o, 1);
      } catch (const SpecError &) {
      }
    }
  }
}

void fuzzLayout(const std::string &bytes) {
  static const std::string path =
      "/tmp/flashjit-fuzz-layout-" + std::to_string(::getpid()) + ".txt";
  FILE *f = std::fopen(path.c_str(), "wb");
  require(f != nullptr, "cannot write the layout file");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  BlockSparseLayout l;
  try {
    l = BlockSparseLayout::readText(path);
  } catch (const SpecError &e) {
    require(e.what()[0] != '\0', "an empty error message");
    return;
  }
  require(l.qBlocks >= 1 && l.kvBlocks >= 1, "an empty layout was accepted");
  Problem p;
  p.seqLenQ = l.qBlocks * 16;
  p.seqLenKV = l.kvBlocks * 16;
  l.checkFits(p, 16); // a read layout always fits its own shape
  BlockSparseLayout t = l.transposed();
  require(t.qBlocks == l.kvBlocks && t.kvBlocks == l.qBlocks,
          "the transpose's shape");
  (void)l.density();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  std::string rest(reinterpret_cast<const char *>(data) + 1, size - 1);
  if (data[0] % 2 == 0)
    fuzzArgv(rest);
  else
    fuzzLayout(rest);
  return 0;
}
