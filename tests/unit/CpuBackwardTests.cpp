//===- CpuBackwardTests.cpp - The tiled backward on the CPU vs float64 ----===//
//
/// \file
/// Runs the forward on the CPU (as a user would: O rounded to the element
/// type, lse in f32), then the tiled backward (preprocess, the KV-major main
/// loop, the dQ step) and compares dQ, dK and dV with the float64 gradients
/// of the naive attention by relative norm error. Fresh random inputs and dO
/// every run, gradients poisoned with NaN before the run. Every case runs in
/// both dQ modes: atomic (the default: the main loop adds into dq_accum, a
/// conversion writes dQ) and deterministic (a separate dQ pass). The matrix
/// covers
/// head dims {1, 16, 33, 64, 80, 96, 128, 160, 256, 512}, dqk != dv, N of 1,
/// 17 and 1000, Nq != Nkv both ways, tiles that do not divide N, causal,
/// windows, rows that see no key (lse = -inf), GQA, block-sparse layouts
/// (random, an empty row, full), a packed qkv tensor's strides, bf16, fp16.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "dialects/Tile/IR/TileDialect.h"
#include "kernels/GpuDefaults.h"
#include "kernels/GpuGeometry.h"
#include "kernels/HostTensor.h"
#include "tools/cli/CliOptions.h"

#include "tests/unit/AttentionCases.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace flashjit;

namespace {

using namespace flashjit::test;

/// Everything one backward run needs.
struct BackwardRun {
  AttentionSpec spec; ///< the forward's; the backward's differs in direction
  TileConfig config;
  Problem problem;
  AttentionData data;
  AttentionGrads grads;
  std::unique_ptr<BlockSparseLayout> layout;
  /// The backward's dQ mode (false: atomic, the default).
  bool deterministic = false;

  AttentionSpec backwardSpec() const {
    AttentionSpec s = spec;
    s.direction = Direction::Backward;
    s.deterministic = deterministic;
    return s;
  }
};

/// Fresh inputs, the forward run on the CPU (O and lse), fresh dO and
/// NaN-poisoned gradients.
BackwardRun prepare(const Case &c, uint64_t seed) {
  BackwardRun s;
  s.spec.headDimQK = c.dqk;
  s.spec.headDimV = c.dv;
  s.spec.dtype = c.dtype;
  s.spec.mask = c.mask;
  s.spec.gqaGroup = c.gqa;
  s.spec.blockSparse = c.layout != LayoutKind::Dense;
  s.spec.sparseBlock = c.sparseBlock;
  s.spec.scoreMod = c.scoreMod;
  s.config.blockM = c.br;
  s.config.blockN = c.bc;
  s.problem.batch = c.batch;
  s.problem.heads = c.heads;
  s.problem.seqLenQ = c.nq;
  s.problem.seqLenKV = c.nkv;
  s.problem.windowLeft = c.winL;
  s.problem.windowRight = c.winR;
  std::mt19937_64 rng(seed);
  s.data = makeRandomInputs(s.spec, s.problem, c.qkv, rng);
  if (s.spec.blockSparse)
    s.layout = std::make_unique<BlockSparseLayout>(makeLayout(c, seed));
  CpuKernel::compile(s.spec, s.config)->run(s.problem, s.data, s.layout.get());
  s.grads = makeRandomGrads(s.spec, s.problem, s.data, rng);
  return s;
}

/// A case of the matrix and the dQ mode (true: deterministic).
class CpuBackward : public ::testing::TestWithParam<std::tuple<Case, bool>> {};

TEST_P(CpuBackward, MatchesFloat64Gradients) {
  const auto &[c, deterministic] = GetParam();
  uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "input seed " << seed);
  BackwardRun s = prepare(c, seed);
  s.deterministic = deterministic;
  if (c.qkv == QKVLayout::Packed) {
    ASSERT_EQ(s.data.q.buffer, s.data.k.buffer) << "case must use packed qkv";
    ASSERT_EQ(s.grads.dq.buffer, s.grads.dk.buffer) << "and packed grads";
  }
  auto kernel = CpuBackwardKernel::compile(s.backwardSpec(), s.config);
  kernel->run(s.problem, s.data, s.grads, s.layout.get());

  BackwardReference ref =
      referenceBackward(s.spec, s.problem, s.data, s.grads, s.layout.get());
  BackwardErrorReport err = compareBackward(s.spec, s.problem, s.grads, ref);
  double bound = errorBound(s.spec.dtype);
  RecordProperty("dq_rel_err", std::to_string(err.dqRelErr));
  RecordProperty("dk_rel_err", std::to_string(err.dkRelErr));
  RecordProperty("dv_rel_err", std::to_string(err.dvRelErr));
  EXPECT_EQ(err.nanCount, 0) << "NaN (or unwritten poisoned) gradients";
  EXPECT_LT(err.dqRelErr, bound);
  EXPECT_LT(err.dkRelErr, bound);
  EXPECT_LT(err.dvRelErr, bound);

  // Rows that see no key (lse = -inf): dQ exactly 0.
  const Problem &p = s.problem;
  for (int64_t row = 0; row < p.batch * p.heads * p.seqLenQ; ++row) {
    if (!(std::isinf(s.data.lse[row]) && s.data.lse[row] < 0))
      continue;
    int64_t bh = row / p.seqLenQ, i = row % p.seqLenQ;
    for (int64_t d = 0; d < c.dqk; ++d)
      ASSERT_EQ(halfToFloat(s.spec.dtype,
                            s.grads.dq.at(bh / p.heads, bh % p.heads, i, d)),
                0.0f)
          << "row " << row;
  }
}

// clang-format off
const Case kCases[] = {
  // name          dqk  dv  dt  mask   g  Br  Bc  B  H   Nq    Nkv
  {"d1_n17",        1,   1, BF, NONE,  1, 16, 16, 2, 8,   17,   17},
  {"d16_n1_nkv1",  16,  16, FP, NONE,  1, 16, 16, 1, 1,    1,    1},
  {"d16_causal_n1000", 16, 16, BF, CAUSAL, 1, 64, 64, 1, 1, 1000, 1000},
  {"d33_dv64_nq_lt_nkv_causal", 33, 64, BF, CAUSAL, 1, 16, 32, 1, 1, 17, 300},
  {"d64_fp16_window", 64, 64, FP, WIN, 1, 64, 32, 1, 1, 257, 257, 50, 20},
  {"d80_gqa4",     80,  80, BF, NONE,  4, 32, 64, 2, 8,   64,   64},
  {"d96_causal_nq_gt_nkv_empty_rows", 96, 96, BF, CAUSAL, 1, 64, 64, 1, 2, 300, 100},
  {"d128_sparse_random", 128, 128, BF, NONE, 1, 32, 64, 1, 2, 300, 300, 0, 0, LayoutKind::Random, 64},
  {"d160_dv128_fp16_sparse_emptyrow_causal", 160, 128, FP, CAUSAL, 1, 64, 32, 1, 2, 256, 256, 0, 0, LayoutKind::EmptyRow, 64},
  {"d256_sparse_full_window", 256, 256, BF, WIN, 1, 32, 32, 1, 1, 200, 200, 64, 64, LayoutKind::Full, 64},
  {"d512_dv32_br16_bc32", 512, 32, BF, NONE, 1, 16, 32, 1, 1, 64, 64},
  {"d32_dv512", 32, 512, FP, CAUSAL, 1, 32, 16, 1, 1, 40, 50},
  {"d64_packed_qkv_causal", 64, 64, BF, CAUSAL, 1, 48, 40, 2, 4, 200, 200, 0, 0, LayoutKind::Dense, 128, QKVLayout::Packed},
  {"d128_fp16_window_nq_gt_nkv", 128, 128, FP, WIN, 1, 64, 64, 1, 1, 300, 100, 10, 10},
  {"d64_gqa2_causal_sparse_random", 64, 64, BF, CAUSAL, 2, 64, 64, 2, 4, 256, 256, 0, 0, LayoutKind::Random, 128},
  {"d32_dv16_window_left_only", 32, 16, FP, WIN, 1, 16, 16, 1, 1, 100, 140, 5, 0},
};
// clang-format on

/// A test's name: the case's and its dQ mode.
std::string
caseAndMode(const ::testing::TestParamInfo<std::tuple<Case, bool>> &info) {
  return std::string(std::get<0>(info.param).name) +
         (std::get<1>(info.param) ? "_deterministic" : "_atomic");
}

// The score modifiers: P recomputed from the modified scores, dS carried
// back through the derivative the tiling derives from the region (softcap:
// 1 - tanh^2; ALiBi: 1, its bias read from the index tiles, transposed in
// the dK/dV loop); a softcap test fails without the derivative.
// clang-format off
const Case kScoreModCases[] = {
  {"d64_softcap5_causal_gqa2", 64, 64, BF, CAUSAL, 2, 64, 64, 1, 4, 200, 230, 0, 0, LayoutKind::Dense, 128, QKVLayout::Separate, "softcap:5"},
  {"d32_fp16_softcap2_window_nq_gt_nkv", 32, 32, FP, WIN, 1, 32, 32, 1, 2, 150, 100, 20, 10, LayoutKind::Dense, 128, QKVLayout::Separate, "softcap:2"},
  {"d96_alibi4_causal_nq_lt_nkv", 96, 96, BF, CAUSAL, 1, 64, 32, 1, 4, 130, 170, 0, 0, LayoutKind::Dense, 128, QKVLayout::Separate, "alibi:4"},
  {"d64_alibi8_gqa4_sparse", 64, 64, BF, NONE, 4, 64, 64, 1, 8, 256, 256, 0, 0, LayoutKind::Random, 64, QKVLayout::Separate, "alibi:8"},
};
// clang-format on

INSTANTIATE_TEST_SUITE_P(ScoreMods, CpuBackward,
                         ::testing::Combine(::testing::ValuesIn(kScoreModCases),
                                            ::testing::Bool()),
                         caseAndMode);

INSTANTIATE_TEST_SUITE_P(Matrix, CpuBackward,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Bool()),
                         caseAndMode);

Case smallCase() {
  return {"small", 32, 32, BF, CAUSAL, 2, 16, 16, 1, 4, 70, 70};
}

/// The check must be able to fail: a corrupted dK, or an element never
/// written, is rejected.
TEST(CpuBackwardCheck, DetectsWrongAndUnwrittenGradients) {
  BackwardRun s = prepare(smallCase(), freshSeed());
  auto kernel = CpuBackwardKernel::compile(s.backwardSpec(), s.config);
  kernel->run(s.problem, s.data, s.grads, nullptr);
  BackwardReference ref =
      referenceBackward(s.spec, s.problem, s.data, s.grads, nullptr);
  ASSERT_LT(compareBackward(s.spec, s.problem, s.grads, ref).relErr(), 1e-2);

  AttentionGrads wrong = s.grads;
  wrong.dk.buffer = std::make_shared<std::vector<uint16_t>>(*s.grads.dk.buffer);
  for (int64_t d = 0; d < 32; ++d)
    wrong.dk.at(0, 1, 5, d) = floatToHalf(s.spec.dtype, 3.0f);
  BackwardErrorReport e = compareBackward(s.spec, s.problem, wrong, ref);
  EXPECT_GT(e.dkRelErr, 1e-2);
  EXPECT_GT(e.relErr(), 1e-2);

  AttentionGrads unwritten = s.grads;
  unwritten.dv.buffer =
      std::make_shared<std::vector<uint16_t>>(*s.grads.dv.buffer);
  unwritten.dv.at(0, 0, 3, 3) = floatToHalf(s.spec.dtype, std::nanf(""));
  EXPECT_FALSE(std::isfinite(
      compareBackward(s.spec, s.problem, unwritten, ref).relErr()));
}

/// deterministic: dQ by a separate pass: bit-identical gradients run to
/// run, on several threads; a caller's workspace gives the same bits.
TEST(CpuBackwardCheck, DeterministicAndCallerWorkspace) {
  Case c = smallCase();
  c.nq = c.nkv = 300;
  BackwardRun s = prepare(c, freshSeed());
  s.deterministic = true;
  auto kernel = CpuBackwardKernel::compile(s.backwardSpec(), s.config);
  kernel->run(s.problem, s.data, s.grads, nullptr);
  AttentionGrads first = s.grads;
  for (HalfTensor *t : {&first.dq, &first.dk, &first.dv})
    t->buffer = std::make_shared<std::vector<uint16_t>>(*t->buffer);

  AttentionSpec atomic = s.backwardSpec();
  atomic.deterministic = false;
  int64_t bytes = backwardWorkspaceBytes(s.backwardSpec(), s.problem);
  const int64_t rows = s.problem.batch * s.problem.heads * s.problem.seqLenQ;
  EXPECT_EQ(bytes, 2 * 4 * rows); // delta and -lse * log2(e)
  // Then dq_accum, from the next 16-byte boundary.
  EXPECT_EQ(backwardWorkspaceBytes(atomic, s.problem),
            (bytes + 15) / 16 * 16 + 4 * rows * c.dqk);
  std::vector<float> workspace(size_t(bytes / 4), std::nanf(""));
  for (int run = 0; run < 3; ++run) {
    kernel->run(s.problem, s.data, s.grads, nullptr,
                run == 2 ? workspace.data() : nullptr, bytes);
    EXPECT_EQ(*s.grads.dq.buffer, *first.dq.buffer) << "run " << run;
    EXPECT_EQ(*s.grads.dk.buffer, *first.dk.buffer) << "run " << run;
    EXPECT_EQ(*s.grads.dv.buffer, *first.dv.buffer) << "run " << run;
  }
  EXPECT_THROW(kernel->run(s.problem, s.data, s.grads, nullptr,
                           workspace.data(), bytes - 4),
               SpecError);
}

/// Atomic dQ in a caller's workspace, poisoned with NaN and reused: the
/// preprocessing zeroes dq_accum (f32 [B, H, Nq, dqk] after delta's 2 * B *
/// H * Nq floats) every run, and dQ is dq_accum * scale in the element type;
/// dK and dV stay bit-identical run to run. A workspace sized for the
/// deterministic backward is refused.
TEST(CpuBackwardCheck, AtomicDqAccumInCallerWorkspace) {
  Case c = smallCase();
  c.nq = 100;
  c.nkv = 130;
  uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "input seed " << seed);
  BackwardRun s = prepare(c, seed);
  ASSERT_FALSE(s.deterministic);
  auto kernel = CpuBackwardKernel::compile(s.backwardSpec(), s.config);
  const Problem &p = s.problem;
  const int64_t rows = p.batch * p.heads * p.seqLenQ;
  const int64_t bytes = backwardWorkspaceBytes(s.backwardSpec(), p);
  ASSERT_EQ(bytes, 4 * rows * (2 + c.dqk));
  std::vector<float> workspace(size_t(bytes / 4), std::nanf(""));
  BackwardReference ref =
      referenceBackward(s.spec, p, s.data, s.grads, nullptr);
  std::vector<uint16_t> firstDk, firstDv;
  for (int run = 0; run < 2; ++run) {
    kernel->run(p, s.data, s.grads, nullptr, workspace.data(), bytes);
    BackwardErrorReport err = compareBackward(s.spec, p, s.grads, ref);
    EXPECT_EQ(err.nanCount, 0) << "run " << run;
    EXPECT_LT(err.relErr(), errorBound(s.spec.dtype)) << "run " << run;
    if (run == 0) {
      firstDk = *s.grads.dk.buffer;
      firstDv = *s.grads.dv.buffer;
    }
  }
  // Only dQ's adds race: dK and dV are bit-identical run to run.
  EXPECT_EQ(*s.grads.dk.buffer, firstDk);
  EXPECT_EQ(*s.grads.dv.buffer, firstDv);
  const float *dqAccum = workspace.data() + 2 * rows;
  const float scale = float(p.effectiveScale(s.spec));
  // dq_accum's rows are in quad order (the default `dq-quad-order`; d 32 is
  // a multiple of 16): column d at tile::quadColumn(d) (DqQuadOrderTests).
  ASSERT_EQ(c.dqk % 16, 0);
  int64_t nonzero = 0;
  for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
    for (int64_t i = 0; i < p.seqLenQ; ++i)
      for (int64_t d = 0; d < c.dqk; ++d) {
        float acc = dqAccum[(bh * p.seqLenQ + i) * c.dqk + tile::quadColumn(d)];
        nonzero += acc != 0.0f;
        ASSERT_EQ(s.grads.dq.at(bh / p.heads, bh % p.heads, i, d),
                  floatToHalf(s.spec.dtype, acc * scale))
            << "bh " << bh << " row " << i << " col " << d;
      }
  EXPECT_GT(nonzero, 0);
  AttentionSpec deterministic = s.backwardSpec();
  deterministic.deterministic = true;
  EXPECT_THROW(kernel->run(p, s.data, s.grads, nullptr, workspace.data(),
                           backwardWorkspaceBytes(deterministic, p)),
               SpecError);
}

TEST(CpuBackwardCheck, RefusesMismatchedSpecsAndShapes) {
  BackwardRun s = prepare(smallCase(), freshSeed());
  EXPECT_THROW(CpuBackwardKernel::compile(s.spec, s.config), SpecError);
  EXPECT_THROW(CpuKernel::compile(s.backwardSpec(), s.config), SpecError);
  auto kernel = CpuBackwardKernel::compile(s.backwardSpec(), s.config);
  AttentionGrads bad = s.grads;
  bad.dk = HalfTensor::packed({1, 4, 70, 32}); // dk shaped as q, not k
  EXPECT_THROW(kernel->run(s.problem, s.data, bad, nullptr), SpecError);
}

/// The sampled reference (for problems too large for the whole one) agrees
/// with referenceBackward on the entries it computes, over GQA, a causal
/// mask with Nq > Nkv (rows that see no key) and a random layout; its
/// comparison passes the kernel's gradients and rejects a corrupted key.
TEST(CpuBackwardCheck, SampledReferenceMatchesTheWholeOne) {
  Case c = {
      "sampled",          40, 24, BF, CAUSAL, 2, 32, 32, 2, 4, 150, 100, 0, 0,
      LayoutKind::Random, 32};
  uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "input seed " << seed);
  BackwardRun s = prepare(c, seed);
  auto kernel = CpuBackwardKernel::compile(s.backwardSpec(), s.config);
  kernel->run(s.problem, s.data, s.grads, s.layout.get());
  const Problem &p = s.problem;
  BackwardReference whole =
      referenceBackward(s.spec, p, s.data, s.grads, s.layout.get());
  // Rows of every (b, h) incl. 0..49, which see no key (Nq - Nkv = 50);
  // keys of every (b, hk).
  std::vector<int64_t> rows, keys;
  for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
    for (int64_t i : {0, 49, 50, 77, 149})
      rows.push_back(bh * p.seqLenQ + i);
  for (int64_t bhk = 0; bhk < p.batch * p.kvHeads(s.spec); ++bhk)
    for (int64_t j : {0, 31, 32, 99})
      keys.push_back(bhk * p.seqLenKV + j);
  SampledBackwardReference sampled = referenceBackwardSampled(
      s.spec, p, s.data, s.grads, s.layout.get(), rows, keys);
  ASSERT_EQ(sampled.rows, rows);
  ASSERT_EQ(sampled.keys, keys);
  // lse is the forward's f32: agreement to ~1e-6, not to the last bit.
  auto expectClose = [](const std::vector<int64_t> &entries, int64_t width,
                        const std::vector<double> &got,
                        const std::vector<double> &all, const char *what) {
    double num = 0, den = 0;
    for (size_t e = 0; e < entries.size(); ++e)
      for (int64_t c = 0; c < width; ++c) {
        double x = got[e * size_t(width) + size_t(c)];
        double y = all[size_t(entries[e] * width + c)];
        num += (x - y) * (x - y);
        den += y * y;
      }
    EXPECT_GT(den, 0) << what;
    EXPECT_LT(std::sqrt(num / den), 1e-5) << what;
  };
  expectClose(rows, c.dqk, sampled.dq, whole.dq, "dq");
  expectClose(keys, c.dqk, sampled.dk, whole.dk, "dk");
  expectClose(keys, c.dv, sampled.dv, whole.dv, "dv");
  for (int64_t c2 = 0; c2 < c.dqk; ++c2) // row 0 of (0, 0) sees no key
    EXPECT_EQ(sampled.dq[size_t(c2)], 0.0);

  BackwardErrorReport e = compareBackwardSampled(s.spec, p, s.grads, sampled);
  EXPECT_EQ(e.nanCount, 0);
  EXPECT_LT(e.relErr(), errorBound(s.spec.dtype));
  AttentionGrads wrong = s.grads;
  wrong.dk.buffer = std::make_shared<std::vector<uint16_t>>(*s.grads.dk.buffer);
  for (int64_t d = 0; d < c.dqk; ++d)
    wrong.dk.at(1, 1, 31, d) = floatToHalf(s.spec.dtype, 3.0f);
  EXPECT_GT(compareBackwardSampled(s.spec, p, wrong, sampled).dkRelErr, 1e-2);
  wrong.dk.at(1, 1, 31, 0) = floatToHalf(s.spec.dtype, std::nanf(""));
  EXPECT_EQ(compareBackwardSampled(s.spec, p, wrong, sampled).nanCount, 1);
  EXPECT_EQ(countNaN(s.spec.dtype, wrong.dk), 1);
  EXPECT_EQ(countNaN(s.spec.dtype, s.grads.dk), 0);
}

/// checkBackward's three scopes by budget: every head; batch 0's first KV
/// head group; a sample of that group's rows and keys. Each scope passes
/// the kernel's gradients and rejects a corrupted gradient inside it; NaN
/// counts everywhere.
TEST(CpuBackwardCheck, BoundedCheckScopes) {
  Case c = {"scopes", 32, 16, BF, NONE, 2, 32, 32, 2, 4, 100, 90};
  uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "input seed " << seed);
  BackwardRun s = prepare(c, seed);
  auto kernel = CpuBackwardKernel::compile(s.backwardSpec(), s.config);
  kernel->run(s.problem, s.data, s.grads, nullptr);
  const Problem &p = s.problem;
  const double perHead = 100.0 * 90.0 * 32.0, bound = errorBound(BF);

  BackwardCheck all = checkBackward(s.spec, p, s.data, s.grads, nullptr, 1e12);
  EXPECT_EQ(all.checkedHeads, 8);
  EXPECT_FALSE(all.sampledRows.has_value());
  EXPECT_LT(all.err.relErr(), bound);

  BackwardCheck group =
      checkBackward(s.spec, p, s.data, s.grads, nullptr, perHead * 2);
  EXPECT_EQ(group.checkedHeads, 2);
  EXPECT_FALSE(group.sampledRows.has_value());
  EXPECT_LT(group.err.relErr(), bound);

  BackwardCheck sampled =
      checkBackward(s.spec, p, s.data, s.grads, nullptr, perHead / 2);
  EXPECT_EQ(sampled.checkedHeads, 2);
  ASSERT_TRUE(sampled.sampledRows.has_value());
  EXPECT_GE(*sampled.sampledRows, 4); // >= 2 rows of each query head
  EXPECT_LT(*sampled.sampledRows, 2 * 100);
  EXPECT_GE(*sampled.sampledKeys, 2);
  EXPECT_LT(*sampled.sampledKeys, 90);
  EXPECT_LT(sampled.err.relErr(), bound);

  // Key 0 of batch 0's KV head 0 is in every scope; (1, 1) only in the
  // whole one; NaN anywhere fails every scope.
  AttentionGrads wrong = s.grads;
  wrong.dk.buffer = std::make_shared<std::vector<uint16_t>>(*s.grads.dk.buffer);
  for (int64_t d = 0; d < c.dqk; ++d) {
    wrong.dk.at(0, 0, 0, d) = floatToHalf(BF, 3.0f);
    wrong.dk.at(1, 1, 5, d) = floatToHalf(BF, 3.0f);
  }
  for (double work : {1e12, perHead * 2, perHead / 2})
    EXPECT_GT(
        checkBackward(s.spec, p, s.data, wrong, nullptr, work).err.dkRelErr,
        bound)
        << work;
  for (int64_t d = 0; d < c.dqk; ++d)
    wrong.dk.at(0, 0, 0, d) = s.grads.dk.at(0, 0, 0, d);
  EXPECT_GT(checkBackward(s.spec, p, s.data, wrong, nullptr, 1e12).err.relErr(),
            bound);
  EXPECT_LT(checkBackward(s.spec, p, s.data, wrong, nullptr, perHead * 2)
                .err.relErr(),
            bound);
  wrong.dk.at(1, 1, 5, 0) = floatToHalf(BF, std::nanf(""));
  for (double work : {1e12, perHead * 2, perHead / 2}) {
    BackwardCheck nan = checkBackward(s.spec, p, s.data, wrong, nullptr, work);
    EXPECT_EQ(nan.err.nanCount, 1) << work;
    EXPECT_FALSE(std::isfinite(nan.err.relErr())) << work;
  }
}

/// The KV-major layout lists, for each KV block, the Q blocks that list it.
TEST(CpuBackwardCheck, TransposedLayout) {
  std::vector<uint8_t> dense = {1, 0, 1, //
                                0, 0, 0, //
                                1, 1, 0};
  auto l = BlockSparseLayout::fromDense(1, 1, 3, 3, dense);
  auto t = l.transposed();
  EXPECT_EQ(t.qBlocks, 3);
  EXPECT_EQ(t.counts, (std::vector<int32_t>{2, 1, 1}));
  for (int64_t qb = 0; qb < 3; ++qb)
    for (int64_t kb = 0; kb < 3; ++kb)
      EXPECT_EQ(t.contains(0, 0, kb, qb), l.contains(0, 0, qb, kb));
}

/// A row that lists a KV block twice is a named error, not an overflow of
/// the transpose's row (which has room for each Q block once).
TEST(CpuBackwardCheck, TransposeRefusesDuplicateBlocks) {
  auto l = BlockSparseLayout::fromDense(1, 1, 2, 2, {1, 1, 1, 1});
  l.indices = {1, 1, 0, 1}; // Q block 0 lists KV block 1 twice
  try {
    l.transposed();
    ADD_FAILURE() << "expected a SpecError";
  } catch (const SpecError &e) {
    EXPECT_NE(std::string(e.what()).find("KV block 1 is listed twice"),
              std::string::npos)
        << e.what();
  }
}

/// --backward selects the backward description (attn.flash_bwd), which
/// validates; its GPU stages are a named SpecError.
TEST(CpuBackwardCheck, CliFlagDescriptionAndGpuStages) {
  const char *argv[] = {"flashjit", "run",          "--backward", "--head-dim",
                        "40",       "--head-dim-v", "24",         "--causal"};
  cli::CliOptions o = cli::parseCommandLine(8, argv);
  EXPECT_EQ(o.spec.direction, Direction::Backward);
  EXPECT_NO_THROW(o.spec.validate());
  std::string text = attnModuleText(o.spec, "k");
  EXPECT_NE(text.find("attn.flash_bwd @k"), std::string::npos) << text;
  EXPECT_NE(o.spec.name().find("bwd_"), std::string::npos);
  // The tiled @attention_dq: the conversion of atomic dQ by default, the
  // separate pass when deterministic.
  std::string tiled = emitStage(o.spec, o.config, Stage::Tile);
  EXPECT_NE(tiled.find("@attention_dq("), std::string::npos);
  EXPECT_NE(tiled.find("role = \"dq_convert\""), std::string::npos);
  EXPECT_NE(tiled.find("tile.atomic_add"), std::string::npos);
  o.spec.deterministic = true;
  tiled = emitStage(o.spec, o.config, Stage::Tile);
  EXPECT_NE(tiled.find("role = \"dq\""), std::string::npos);
  EXPECT_EQ(tiled.find("tile.atomic_add"), std::string::npos);
  EXPECT_EQ(tiled.find("memref.atomic_rmw"), std::string::npos);
  // The GPU stages (both forms): three kernels, tensor cores, no
  // transposes through shared memory other than ldmatrix's; atomic dQ adds
  // with reductions.
  for (bool deterministic : {false, true}) {
    o.spec.deterministic = deterministic;
    std::string ptx =
        compileToPtx(o.spec, defaultGpuBackwardConfig(o.spec), GpuTarget{});
    EXPECT_EQ(ptx.find("red.global.add.f32") != std::string::npos,
              !deterministic);
  }
  TileConfig gpu = defaultGpuBackwardConfig(o.spec);
  std::string gpuIr = emitStage(o.spec, gpu, Stage::Gpu);
  for (const char *fn : {"gpu.func @attention_preprocess(",
                         "gpu.func @attention(", "gpu.func @attention_dq("})
    EXPECT_NE(gpuIr.find(fn), std::string::npos) << fn;
  std::string ptx = compileToPtx(o.spec, gpu, GpuTarget{});
  for (const char *needle :
       {".entry attention_preprocess(", ".entry attention(",
        ".entry attention_dq(", "mma.sync.aligned.m16n8k16.row.col.f32.bf16",
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
        "cp.async.wait_group \t1;"})
    EXPECT_NE(ptx.find(needle), std::string::npos) << needle;
  // A tiling the backward kernels cannot split is a named error.
  TileConfig bad = gpu;
  bad.blockN = 48;
  try {
    compileToPtx(o.spec, bad, GpuTarget{});
    FAIL() << "expected a SpecError";
  } catch (const SpecError &e) {
    EXPECT_NE(std::string(e.what()).find("block_n (48)"), std::string::npos)
        << e.what();
  }
}

} // namespace
