//===- RunInputs.cpp - The inputs of a run: data, layout, captures --------===//
//
/// \file
/// What `run`, `bench` and `tune` run on: fresh random q, k, v (replayable
/// from the reported seeds), the block-sparse layout of --layout or
/// --block-sparse, and the score modifier's captured tensors from the
/// --capture files.
//
//===----------------------------------------------------------------------===//

#include "tools/cli/CliOptions.h"
#include "kernels/HostTensor.h"

#include <fmt/format.h>
#include <random>

namespace flashjit::cli {

/// The block-sparse layout the options describe (nullptr when dense):
/// --layout FILE, else a random one of --block-sparse DENSITY from \p seed.
std::unique_ptr<BlockSparseLayout> layoutFromOptions(const CliOptions &o,
                                                     uint64_t seed) {
  const AttentionSpec &spec = o.spec;
  const Problem &p = o.problem;
  if (!spec.blockSparse)
    return nullptr;
  int64_t sb = spec.sparseBlock;
  if (o.layoutPath.empty()) {
    // A random layout is drawn for every (batch, head).
    int64_t cells = 0;
    if (__builtin_mul_overflow(p.batch * p.heads,
                               ((p.seqLenQ + sb - 1) / sb) *
                                   ((p.seqLenKV + sb - 1) / sb),
                               &cells) ||
        cells > kMaxTensorElements)
      throw SpecError(fmt::format(
          "problem too large: a random layout of batch * heads * q_blocks * "
          "kv_blocks = {} * {} * {} * {} blocks exceeds 2^40",
          p.batch, p.heads, (p.seqLenQ + sb - 1) / sb,
          (p.seqLenKV + sb - 1) / sb));
  }
  auto layout = std::make_unique<BlockSparseLayout>(
      !o.layoutPath.empty()
          ? BlockSparseLayout::readText(o.layoutPath)
          : BlockSparseLayout::random(
                p.batch, p.heads, (p.seqLenQ + sb - 1) / sb,
                (p.seqLenKV + sb - 1) / sb, *o.density, seed));
  layout->checkFits(p, sb);
  return layout;
}

/// The captured tensors of \p spec's score modifier from the --capture
/// files, one per tensor in the region's order.
static Captures readCaptures(const CliOptions &o, const AttentionSpec &spec) {
  if (int64_t(o.captureFiles.size()) != spec.captures)
    throw SpecError(fmt::format(
        "the score modifier captures {} tensors, --capture gives {} (one "
        ".npy file per tensor, in the region's argument order)",
        spec.captures, o.captureFiles.size()));
  Captures out;
  for (const std::string &path : o.captureFiles) {
    out.push_back(readNpyAsF32(path));
    if (out.back().empty())
      throw SpecError(fmt::format("--capture '{}': an empty tensor", path));
  }
  return out;
}

RandomRun makeRandomRun(const CliOptions &o, const AttentionSpec &forwardSpec) {
  RandomRun r;
  std::random_device entropy;
  r.layoutSeed = o.seedGiven ? o.seed : entropy();
  r.layout = layoutFromOptions(o, r.layoutSeed);
  // --seed makes the inputs replayable too (same seed, same bits).
  r.inputSeed = o.seedGiven ? o.seed ^ 0x5851f42d4c957f2dull
                            : (uint64_t(entropy()) << 32) ^ entropy();
  std::mt19937_64 rng(r.inputSeed);
  r.data = makeRandomInputs(
      forwardSpec, o.problem,
      o.packedQKV ? QKVLayout::Packed : QKVLayout::Separate, rng);
  r.data.captures = readCaptures(o, forwardSpec);
  return r;
}

} // namespace flashjit::cli
