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
#include "kernels/Varlen.h"

#include <cerrno>
#include <cstdlib>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <random>

namespace flashjit::cli {

/// The block-sparse layout the options describe (nullptr when dense):
/// --layout FILE, else a random one of --block-sparse DENSITY from \p seed.
std::unique_ptr<BlockSparseLayout> layoutFromOptions(const CliOptions &o,
                                                     uint64_t seed) {
  const AttentionSpec &spec = o.spec;
  const Problem &p = o.problem;
  if (!spec.blockSparse || o.maskBlocks) // --mask-blocks: classified later
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
  r.data = forwardSpec.varlen
               ? makeRandomVarlenInputs(forwardSpec, o.problem, o.seqLensQ,
                                        o.seqLensKV, rng)
               : makeRandomInputs(forwardSpec, o.problem,
                                  o.packedQKV ? QKVLayout::Packed
                                              : QKVLayout::Separate,
                                  rng);
  r.data.captures = readCaptures(o, forwardSpec);
  return r;
}

std::vector<int64_t> parseLengths(const std::string &flag,
                                  const std::string &text) {
  std::vector<int64_t> out;
  int64_t total = 0;
  size_t at = 0;
  do {
    const size_t comma = text.find(',', at);
    const std::string item = text.substr(at, comma - at);
    char *end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno == ERANGE || v < 0 ||
        v > (int64_t(1) << 24))
      throw SpecError(fmt::format("{}: expected comma-separated lengths in "
                                  "[0, 2^24], got '{}'",
                                  flag, item));
    out.push_back(v);
    total += v;
    if (total >= (int64_t(1) << 31) || out.size() > (size_t(1) << 20))
      throw SpecError(fmt::format("{}: at most 2^20 sequences of 2^31 - 1 "
                                  "tokens in all",
                                  flag));
    at = comma == std::string::npos ? comma : comma + 1;
  } while (at != std::string::npos);
  return out;
}

std::string seqLensJson(const CliOptions &o) {
  if (o.seqLensQ.empty())
    return "";
  return fmt::format(",\"seqlens_q\":[{}],\"seqlens_kv\":[{}]",
                     fmt::join(o.seqLensQ, ","), fmt::join(o.seqLensKV, ","));
}

void applyVarlenOptions(CliOptions &o, bool batchOrLengthGiven) {
  if (o.seqLensQ.empty()) {
    if (!o.seqLensKV.empty())
      throw SpecError("--seqlens-kv needs --seqlens-q (the query lengths)");
    if (o.spec.varlen && o.command != "compile")
      throw SpecError("a varlen kernel runs on a variable-length batch: give "
                      "--seqlens-q L1,L2,... (and --seqlens-kv)");
    return;
  }
  if (batchOrLengthGiven)
    throw SpecError("--seqlens-q gives the batch and the sequence lengths; "
                    "drop --batch, --seq-len and --seq-len-kv");
  if (!o.source.empty() && !o.spec.varlen)
    throw SpecError(fmt::format("--input {}: the kernel is not varlen; drop "
                                "--seqlens-q / --seqlens-kv",
                                o.source.name));
  if (o.seqLensKV.empty())
    o.seqLensKV = o.seqLensQ;
  if (o.seqLensKV.size() != o.seqLensQ.size())
    throw SpecError(fmt::format("--seqlens-q gives {} sequences, "
                                "--seqlens-kv {}: one length each",
                                o.seqLensQ.size(), o.seqLensKV.size()));
  if (o.packedQKV)
    throw SpecError("--packed-qkv and --seqlens-q: a varlen batch is packed "
                    "token-major already");
  if (!o.dumpDir.empty())
    throw SpecError("--dump-io does not write variable-length batches yet");
  o.spec.varlen = true;
  o.problem = varlenProblem(o.problem, o.seqLensQ, o.seqLensKV);
}

} // namespace flashjit::cli
