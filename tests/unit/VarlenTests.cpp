//===- VarlenTests.cpp - Variable-length packing on the CPU vs float64 ----===//
//
/// \file
/// Variable-length batches (AttentionSpec::varlen): the sequences one after
/// another in token-major (total, H, d) tensors, their offsets read by the
/// kernels. The CPU runs the tiled forward and backward (the programs the
/// GPU runs), and each sequence is checked against the float64 reference of
/// that sequence alone (kernels/Varlen.h), so attention that leaks across a
/// sequence boundary, a wrong start row or a wrong length fails. Fresh
/// random inputs every run; O, lse and the gradients poisoned before it.
/// Covers lengths that do not divide the tiles, a sequence of one token,
/// sequences without queries or without keys, Nq != Nkv per sequence with
/// causal (bottom-right aligned per sequence) and windows, GQA, a score
/// modifier, split-KV decode, the pipelined loop and both dQ modes.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/HalfFloat.h"
#include "kernels/Varlen.h"
#include "tools/cli/CliOptions.h"

#include "tests/unit/AttentionCases.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace flashjit;
using namespace flashjit::test;

namespace {

struct VarlenCase {
  const char *name;
  int64_t dqk, dv;
  DType dtype;
  MaskKind mask;
  int64_t gqa, heads, br, bc;
  std::vector<int64_t> lensQ, lensKV;
  int64_t winL = 0, winR = 0;
  const char *scoreMod = "";
  int64_t splits = 0;
  bool overlap = false;
};

std::ostream &operator<<(std::ostream &os, const VarlenCase &c) {
  return os << c.name;
}

/// A varlen spec, tiling, problem and fresh inputs for \p c.
struct VarlenRun {
  AttentionSpec spec;
  TileConfig config;
  Problem problem;
  AttentionData data;
};

VarlenRun prepare(const VarlenCase &c, uint64_t seed) {
  VarlenRun r;
  r.spec.headDimQK = c.dqk;
  r.spec.headDimV = c.dv;
  r.spec.dtype = c.dtype;
  r.spec.mask = c.mask;
  r.spec.gqaGroup = c.gqa;
  r.spec.scoreMod = c.scoreMod;
  r.spec.varlen = true;
  r.config.blockM = c.br;
  r.config.blockN = c.bc;
  r.config.splits = c.splits;
  r.config.overlapSoftmax = c.overlap;
  Problem like;
  like.heads = c.heads;
  like.windowLeft = c.winL;
  like.windowRight = c.winR;
  r.problem = varlenProblem(like, c.lensQ, c.lensKV);
  std::mt19937_64 rng(seed);
  r.data = makeRandomVarlenInputs(r.spec, r.problem, c.lensQ, c.lensKV, rng);
  return r;
}

// clang-format off
const VarlenCase kCases[] = {
  // name dqk dv dtype mask gqa H Br Bc lensQ lensKV
  {"d64_ragged", 64, 64, BF, NONE, 1, 2, 32, 32, {17, 1, 100, 64}, {17, 1, 100, 64}},
  {"d96_dv64_fp16_causal_gqa2_nq_ne_nkv", 96, 64, FP, CAUSAL, 2, 4, 32, 64, {50, 1, 130}, {70, 40, 130}},
  {"d32_window", 32, 32, BF, WIN, 1, 1, 16, 32, {200, 33}, {150, 33}, 20, 5},
  {"d16_empty_sequences", 16, 16, BF, NONE, 1, 2, 16, 16, {0, 40, 20, 7}, {30, 0, 20, 9}},
  {"d64_softcap_causal", 64, 64, BF, CAUSAL, 1, 2, 32, 32, {90, 45}, {90, 60}, 0, 0, "softcap:5"},
  {"d128_alibi_window_gqa2", 128, 128, FP, WIN, 2, 4, 64, 64, {70, 129}, {70, 140}, 30, 0, "alibi:4"},
  {"d64_overlap_causal", 64, 64, BF, CAUSAL, 1, 2, 32, 32, {130, 5, 64}, {130, 77, 64}, 0, 0, "", 0, true},
};
// Split-KV (decode: one query per sequence; GQA packed rows), forward only.
const VarlenCase kSplitCases[] = {
  {"d64_decode_gqa4_split", 64, 64, BF, NONE, 4, 8, 16, 32, {1, 1, 1}, {300, 17, 1000}, 0, 0, "", 4},
  {"d32_split_auto_causal", 32, 32, FP, CAUSAL, 1, 2, 16, 16, {3, 20, 1}, {60, 20, 0}, 0, 0, "", -1},
};
// clang-format on

class VarlenForward : public ::testing::TestWithParam<VarlenCase> {};

TEST_P(VarlenForward, EachSequenceMatchesItsFloat64Reference) {
  const VarlenCase &c = GetParam();
  uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "input seed " << seed);
  VarlenRun r = prepare(c, seed);
  CpuKernel::compile(r.spec, r.config)->run(r.problem, r.data, nullptr);
  ErrorReport err = checkVarlenForward(r.spec, r.problem, r.data);
  RecordProperty("o_rel_err", std::to_string(err.oRelErr));
  EXPECT_EQ(err.nanCount, 0) << "NaN (or unwritten poisoned) outputs";
  EXPECT_EQ(err.lseMismatch, 0);
  EXPECT_LT(err.oRelErr, errorBound(r.spec.dtype));
  EXPECT_LT(err.lseRelErr, errorBound(r.spec.dtype));
}

INSTANTIATE_TEST_SUITE_P(Cases, VarlenForward, ::testing::ValuesIn(kCases));
INSTANTIATE_TEST_SUITE_P(SplitKv, VarlenForward,
                         ::testing::ValuesIn(kSplitCases));

/// A case and the dQ mode (true: deterministic).
class VarlenBackward
    : public ::testing::TestWithParam<std::tuple<VarlenCase, bool>> {};

TEST_P(VarlenBackward, EachSequenceMatchesItsFloat64Gradients) {
  const auto &[c, deterministic] = GetParam();
  uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "input seed " << seed);
  VarlenRun r = prepare(c, seed);
  r.config.overlapSoftmax = false;
  CpuKernel::compile(r.spec, r.config)->run(r.problem, r.data, nullptr);
  std::mt19937_64 rng(seed + 1);
  AttentionGrads g = makeRandomGrads(r.spec, r.problem, r.data, rng);
  AttentionSpec bwd = r.spec;
  bwd.direction = Direction::Backward;
  bwd.deterministic = deterministic;
  CpuBackwardKernel::compile(bwd, r.config)->run(r.problem, r.data, g, nullptr);
  BackwardErrorReport err = checkVarlenBackward(r.spec, r.problem, r.data, g);
  EXPECT_EQ(err.nanCount, 0) << "NaN (or unwritten poisoned) gradients";
  EXPECT_LT(err.dqRelErr, errorBound(r.spec.dtype));
  EXPECT_LT(err.dkRelErr, errorBound(r.spec.dtype));
  EXPECT_LT(err.dvRelErr, errorBound(r.spec.dtype));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, VarlenBackward,
    ::testing::Combine(::testing::ValuesIn(kCases), ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<VarlenCase, bool>> &info) {
      return std::string(std::get<0>(info.param).name) +
             (std::get<1>(info.param) ? "_deterministic" : "_atomic");
    });

/// The checks can fail: one wrong row of one sequence is caught, and so is
/// the dense kernel run over the packed rows (attention across sequences).
TEST(VarlenCheck, DetectsAWrongRowAndAttentionAcrossSequences) {
  VarlenRun r = prepare(kCases[0], freshSeed());
  CpuKernel::compile(r.spec, r.config)->run(r.problem, r.data, nullptr);
  ASSERT_LT(checkVarlenForward(r.spec, r.problem, r.data).relErr(), 1e-2);

  AttentionData wrong = r.data;
  wrong.o.buffer = std::make_shared<std::vector<uint16_t>>(*r.data.o.buffer);
  const int64_t row = r.data.cuSeqQ[2] + 5; // sequence 2, its row 5
  for (int64_t d = 0; d < r.spec.headDimV; ++d)
    wrong.o.at(0, 1, row, d) = floatToHalf(r.spec.dtype, 3.0f);
  EXPECT_GT(checkVarlenForward(r.spec, r.problem, wrong).oRelErr, 1e-2);

  // One dense sequence of all the rows: every query sees every key.
  AttentionSpec dense = r.spec;
  dense.varlen = false;
  Problem whole = r.problem;
  whole.batch = 1;
  whole.seqLenQ = r.data.cuSeqQ.back();
  whole.seqLenKV = r.data.cuSeqKV.back();
  AttentionData across = r.data;
  across.cuSeqQ.clear();
  across.cuSeqKV.clear();
  across.lse.assign(size_t(whole.heads * whole.seqLenQ), 0.0f);
  CpuKernel::compile(dense, r.config)->run(whole, across, nullptr);
  across.cuSeqQ = r.data.cuSeqQ;
  across.cuSeqKV = r.data.cuSeqKV;
  across.lse = r.data.lse;
  EXPECT_GT(checkVarlenForward(r.spec, r.problem, across).oRelErr, 1e-2);
}

/// `--mask-mod document` (a score_mod region reading segment ids) and a
/// varlen batch of those segments compute the same O on the same data:
/// two mechanisms, one answer (a region that compared the wrong ids would
/// attend across segments and miss by far more than the bound).
TEST(VarlenDocument, DocumentMaskModMatchesTheVarlenBatch) {
  const std::vector<int64_t> lens = {37, 1, 90, 16};
  int64_t n = 0;
  for (int64_t l : lens)
    n += l;
  const std::string seqLen = std::to_string(n);
  const char *argv[] = {"flashjit",     "run",      "--mask-mod", "document",
                        "--head-dim",   "32",       "--heads",    "2",
                        "--dtype",      "fp16",     "--seq-len",  seqLen.c_str()};
  cli::CliOptions o = cli::parseCommandLine(12, argv);
  ASSERT_TRUE(o.spec.scoreMod.empty());
  ASSERT_FALSE(o.spec.maskModRegion.empty()); // a mask_mod region
  ASSERT_EQ(o.spec.captures, 1);
  ASSERT_EQ(o.spec.maskCaptures, 1);
  o.config = tileConfig(32, 32);

  std::mt19937_64 rng(freshSeed());
  AttentionData doc = makeRandomInputs(o.spec, o.problem, QKVLayout::Separate,
                                       rng);
  std::vector<float> seg;
  for (size_t s = 0; s < lens.size(); ++s)
    seg.insert(seg.end(), size_t(lens[s]), float(s));
  doc.captures = {seg};
  CpuKernel::compile(o.spec, o.config)->run(o.problem, doc, nullptr);

  // The same memory as a varlen batch: (1, H, N, d) views, heads-major
  // strides, the segments as sequences.
  AttentionSpec v;
  v.headDimQK = v.headDimV = 32;
  v.dtype = DType::FP16;
  v.varlen = true;
  Problem like;
  like.heads = 2;
  Problem pv = varlenProblem(like, lens, lens);
  AttentionData packed = doc;
  packed.captures.clear();
  packed.o = HalfTensor::packed(doc.o.shape);
  packed.lse.assign(size_t(pv.batch * pv.heads * pv.seqLenQ), 0.0f);
  packed.cuSeqQ = packed.cuSeqKV = offsetsOf(lens);
  CpuKernel::compile(v, o.config)->run(pv, packed, nullptr);

  double num = 0, den = 0;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < 32; ++c) {
        const double a = halfToFloat(v.dtype, doc.o.at(0, h, i, c));
        const double b = halfToFloat(v.dtype, packed.o.at(0, h, i, c));
        num += (a - b) * (a - b);
        den += b * b;
      }
  EXPECT_LT(std::sqrt(num / den), errorBound(v.dtype));
  EXPECT_LT(checkVarlenForward(v, pv, packed).relErr(), errorBound(v.dtype));
}

/// Offsets that do not describe the packed tensors are named errors.
TEST(VarlenInputs, BadOffsetsAreNamedErrors) {
  VarlenRun r = prepare(kCases[0], freshSeed());
  auto kernel = CpuKernel::compile(r.spec, r.config);
  auto expectError = [&](std::vector<int32_t> cu, const char *needle) {
    AttentionData d = r.data;
    d.cuSeqQ = std::move(cu);
    try {
      kernel->run(r.problem, d, nullptr);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const SpecError &e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << e.what();
    }
  };
  expectError({0, 17, 18, 118}, "expected batch + 1 = 5 offsets");
  expectError({1, 17, 18, 118, 182}, "the first offset must be 0");
  expectError({0, 17, 16, 118, 182}, "sequence 1 has length -1");
  expectError({0, 17, 18, 180, 182}, "sequence 2 has length 162");
  expectError({0, 17, 18, 118, 183}, "past the packed tensor's 182 rows");

  AttentionData none = r.data;
  none.cuSeqQ.clear();
  EXPECT_THROW(kernel->run(r.problem, none, nullptr), SpecError);
  AttentionSpec dense = r.spec;
  dense.varlen = false;
  EXPECT_THROW(CpuKernel::compile(dense, r.config)
                   ->run(r.problem, r.data, nullptr),
               SpecError);
}

/// A block-sparse layout per sequence: [B, H, ceil(max_q / S), ceil(max_kv
/// / S)], blocks counted from each sequence's start. Forward and both
/// backward modes match each sequence's float64 reference under its own
/// part of the layout (blocks listed past a sequence's keys are masked
/// there); the same outputs checked without the layout fail (the kernel
/// skipped the blocks it does not list).
TEST(VarlenBlockSparse, EachSequenceUnderItsPartOfTheLayout) {
  VarlenCase c{"d64_sparse", 64, 64, BF, CAUSAL, 2, 4, 32, 32,
               {200, 1, 0, 130}, {150, 40, 7, 260}};
  uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  VarlenRun r = prepare(c, seed);
  r.spec.blockSparse = true;
  r.spec.sparseBlock = 64;
  const int64_t qb = (r.problem.seqLenQ + 63) / 64,
                kvb = (r.problem.seqLenKV + 63) / 64;
  BlockSparseLayout layout = BlockSparseLayout::random(
      r.problem.batch, r.problem.heads, qb, kvb, 0.5, seed);
  layout.checkFits(r.problem, 64);
  CpuKernel::compile(r.spec, r.config)->run(r.problem, r.data, &layout);
  ErrorReport err = checkVarlenForward(r.spec, r.problem, r.data, 1e300,
                                       nullptr, &layout);
  EXPECT_EQ(err.nanCount, 0);
  EXPECT_LT(err.relErr(), 1e-2);
  AttentionSpec dense = r.spec;
  dense.blockSparse = false;
  EXPECT_GT(checkVarlenForward(dense, r.problem, r.data).relErr(), 1e-2);
  std::mt19937_64 rng(seed);
  for (bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic" : "atomic dQ");
    AttentionSpec bwd = r.spec;
    bwd.direction = Direction::Backward;
    bwd.deterministic = deterministic;
    AttentionGrads g = makeRandomGrads(r.spec, r.problem, r.data, rng);
    CpuBackwardKernel::compile(bwd, r.config)
        ->run(r.problem, r.data, g, &layout);
    BackwardErrorReport e = checkVarlenBackward(r.spec, r.problem, r.data, g,
                                                1e300, &layout);
    EXPECT_EQ(e.nanCount, 0);
    EXPECT_LT(e.relErr(), 1e-2);
    EXPECT_GT(checkVarlenBackward(dense, r.problem, r.data, g).relErr(), 1e-2);
  }
}

} // namespace
