//===- IrFuzzTests.cpp - Malformed IR and options are named errors --------===//
//
/// \file
/// A bounded fuzz test of the compiler's front door: valid attn- and
/// tile-stage texts are mutated at random (truncated, spans deleted,
/// numbers and strings replaced, lines swapped or repeated) and compiled
/// through the API the CLI uses (inspectSource, then a GPU or CPU stage)
/// with random tiling options. Every outcome must be a compiled stage or a
/// CompileError / SpecError with a message; a crash, a hang or any other
/// exception fails the test. The seed is printed, so a failure replays.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"

#include "tests/unit/AttentionCases.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>
#include <regex>

using namespace flashjit;

namespace {

/// The valid texts the mutants start from.
std::vector<std::string> seeds() {
  std::vector<std::string> out;
  AttentionSpec causal;
  causal.headDimQK = 64;
  causal.headDimV = 32;
  causal.mask = MaskKind::Causal;
  AttentionSpec sparse;
  sparse.headDimQK = 48;
  sparse.headDimV = 48;
  sparse.blockSparse = true;
  sparse.sparseBlock = 64;
  sparse.dtype = DType::FP16;
  TileConfig config;
  config.blockM = 64;
  config.blockN = 32;
  for (const AttentionSpec &s : {causal, sparse}) {
    out.push_back(emitStage(s, config, Stage::Attn));
    out.push_back(emitStage(s, config, Stage::Tile));
  }
  return out;
}

/// One random edit of \p text.
std::string mutate(std::string text, std::mt19937_64 &rng) {
  auto pick = [&](size_t n) { return size_t(rng() % std::max<size_t>(n, 1)); };
  static const char *numbers[] = {"0",
                                  "-1",
                                  "1",
                                  "3",
                                  "4096",
                                  "2147483648",
                                  "-4611686018427387904",
                                  "99999999999999999999"};
  static const char *strings[] = {"\"causl\"",          "\"\"",   "\"hello\"",
                                  "\"sliding_window\"", "\"dq\"", "\"main\""};
  switch (rng() % 7) {
  case 0: // truncated input
    return text.substr(0, pick(text.size()));
  case 1: { // a span deleted
    size_t at = pick(text.size());
    return text.erase(at, 1 + pick(40));
  }
  case 2: { // a number replaced
    std::regex num(R"(-?\b\d+\b)");
    std::vector<std::pair<size_t, size_t>> hits;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), num);
         it != std::sregex_iterator(); ++it)
      hits.push_back({size_t(it->position()), size_t(it->length())});
    if (hits.empty())
      return text;
    auto [at, len] = hits[pick(hits.size())];
    return text.replace(at, len, numbers[pick(std::size(numbers))]);
  }
  case 3: { // a string replaced
    size_t at = text.find('"', pick(text.size()));
    size_t end = at == std::string::npos ? at : text.find('"', at + 1);
    if (end == std::string::npos)
      return text;
    return text.replace(at, end - at + 1, strings[pick(std::size(strings))]);
  }
  case 4: { // a type replaced
    static const char *types[] = {"f32", "i1", "bf16", "index", "f64"};
    size_t at = text.find("bf16", pick(text.size()));
    if (at == std::string::npos)
      at = text.find("f32", pick(text.size()));
    if (at == std::string::npos)
      return text;
    return text.replace(at, 3, types[pick(std::size(types))]);
  }
  default: { // two lines swapped, or one repeated
    std::vector<std::string> lines;
    size_t start = 0;
    for (size_t nl; (nl = text.find('\n', start)) != std::string::npos;
         start = nl + 1)
      lines.push_back(text.substr(start, nl - start));
    if (lines.size() < 2)
      return text;
    size_t a = pick(lines.size()), b = pick(lines.size());
    if (rng() % 2)
      std::swap(lines[a], lines[b]);
    else
      lines.insert(lines.begin() + a, lines[b]);
    std::string out;
    for (const std::string &l : lines)
      out += l + "\n";
    return out;
  }
  }
}

TEST(IrFuzz, MalformedIrAndOptionsAreNamedErrors) {
  // FLASHJIT_FUZZ_SEED replays a run; FLASHJIT_FUZZ_DUMP=FILE writes each
  // mutant there before compiling it (the last one is the culprit).
  const char *given = std::getenv("FLASHJIT_FUZZ_SEED");
  const char *dump = std::getenv("FLASHJIT_FUZZ_DUMP");
  uint64_t seed = given ? std::strtoull(given, nullptr, 10) : test::freshSeed();
  SCOPED_TRACE(::testing::Message() << "fuzz seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::string> valid = seeds();
  const int64_t blocks[] = {-1, 0, 16, 32, 64, 96, 1024, 4096};
  const int64_t warps[] = {-3, 0, 1, 2, 4, 17};
  const int64_t copies[] = {0, 2, 3, 16, 32};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int tried = 0, compiled = 0, named = 0;
  while (std::chrono::steady_clock::now() < deadline && tried < 3000) {
    std::string text = valid[rng() % valid.size()];
    for (int edits = 1 + int(rng() % 3); edits > 0; --edits)
      text = mutate(text, rng);
    ++tried;
    KernelSource source{text, "mutant.mlir"};
    if (dump)
      std::ofstream(dump) << text;
    try {
      SourceInfo info = inspectSource(source);
      // Half the mutants get valid options (so that mutated IR reaches the
      // lowerings), half random ones (most of them invalid).
      TileConfig config = info.tiling.value_or(TileConfig());
      GpuTarget target;
      target.arch = rng() % 2 ? "sm_90a" : "sm_80";
      if (rng() % 2) {
        if (!info.tiling || rng() % 4 == 0) {
          config.blockM = blocks[rng() % std::size(blocks)];
          config.blockN = blocks[rng() % std::size(blocks)];
        }
        config.warps = warps[rng() % std::size(warps)];
        target.copyBytes = copies[rng() % std::size(copies)];
      }
      Stage stage = rng() % 2 ? Stage::Gpu : Stage::CpuLlvm;
      std::string out = emitStage(info.spec, config, stage, target, source);
      EXPECT_FALSE(out.empty());
      ++compiled;
    } catch (const CompileError &e) {
      EXPECT_GT(std::string(e.what()).size(), 10u) << "unnamed error";
      ++named;
    } catch (const SpecError &e) {
      EXPECT_GT(std::string(e.what()).size(), 10u) << "unnamed error";
      ++named;
    }
  }
  // Most mutants must be refused, and the run must have covered enough.
  EXPECT_GT(tried, 50);
  EXPECT_GT(named, tried / 4);
  std::printf("ir fuzz: %d mutants, %d compiled, %d named errors (seed %llu)\n",
              tried, compiled, named, (unsigned long long)seed);
}

} // namespace
