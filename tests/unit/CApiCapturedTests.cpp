//===- CApiCapturedTests.cpp - Captured tensors through the C API ---------===//
//
/// \file
/// flashjit_forward_captured (version 7): a score_mod region that reads a
/// tensor (a bias of shape (H, Nq, Nkv), indexed by the region itself) runs
/// on the CPU handle against a float64 reference that reads the same data
/// by hand, forward and (flashjit_backward_captured) gradients; the
/// reference on other data fails the kernel (the check can fail); and the
/// named errors: flashjit_forward / flashjit_backward of a capturing spec,
/// a wrong count, NULL data, a bad size, a plan without them, a
/// deterministic gradient without its workspace. A plan of a capturing
/// spec (flashjit_plan_create_captured, version 12) reads each call's
/// tensors: bit for bit flashjit_forward_captured's output on the same
/// data, and its own named errors. The bias's own gradient (grad: added into)
/// too, atomic and deterministic (the same bits on every call).
//
//===----------------------------------------------------------------------===//

#include "tests/unit/AttentionCases.h"
#include "tests/unit/CApiTestUtil.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

using namespace flashjit;
using namespace flashjit::capitest;

namespace {

/// s + bias[(h * Nq + i) * Nkv + j], the bias read from captured tensor 0.
class FullBias : public ScoreFunction {
public:
  FullBias(int64_t nq, int64_t nkv) : nq(nq), nkv(nkv) {}
  double apply(double s, int64_t, int64_t h, int64_t i, int64_t j,
               const Captures *captures, double *dScore) const override {
    *dScore = 1;
    return s + double((*captures)[0][size_t((h * nq + i) * nkv + j)]);
  }
  /// The one load, d score' / d bias = 1.
  std::vector<CaptureRead> captureReads(double, int64_t, int64_t h, int64_t i,
                                        int64_t j,
                                        const Captures *) const override {
    return {{0, (h * nq + i) * nkv + j, 1.0}};
  }
  int64_t nq, nkv;
};

/// FullBias's region for a problem of Nq = 20, Nkv = 33 (SmallProblem's).
const char *kFullBias = R"({
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index, %bias: memref<?xf32>):
  %nq = arith.constant 20 : index
  %nkv = arith.constant 33 : index
  %hq = arith.muli %h, %nq : index
  %row = arith.addi %hq, %i : index
  %rk = arith.muli %row, %nkv : index
  %at = arith.addi %rk, %j : index
  %x = memref.load %bias[%at] : memref<?xf32>
  %y = arith.addf %s, %x : f32
  attn.yield %y : f32
})";

/// A FullBias-sized bias, uniform in [-3, 3).
std::vector<float> randomBias(std::mt19937_64 &rng) {
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  std::vector<float> bias(size_t(4 * 20 * 33));
  for (float &x : bias)
    x = u(rng);
  return bias;
}

/// \p sp with the FullBias region (C and C++ specs) capturing one tensor;
/// a random bias for it.
std::vector<float> withFullBias(SmallProblem &sp, std::mt19937_64 &rng) {
  sp.spec.score_mod = kFullBias;
  sp.specCpp.scoreMod = kCustomScoreMod;
  sp.specCpp.scoreFunction = std::make_shared<FullBias>(20, 33);
  sp.specCpp.captures = 1;
  return randomBias(rng);
}

TEST(CApiCaptured, FullBiasOnTheCpu) {
  Handle h;
  SmallProblem sp; // B 2, H 4, Nq 20, Nkv 33, gqa 2
  ASSERT_EQ(sp.p.seqLenQ, 20);
  ASSERT_EQ(sp.p.seqLenKV, 33);
  uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<float> bias = withFullBias(sp, rng), other = randomBias(rng);
  flashjit_captured captured = {bias.data(), int64_t(bias.size())};
  ASSERT_EQ(flashjit_forward_captured(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o,
                                      sp.d.lse.data(), 0.0, -1, -1, nullptr,
                                      &captured, 1, nullptr),
            FLASHJIT_OK)
      << lastError();
  sp.d.captures = {bias};
  ReferenceResult ref = referenceForward(sp.specCpp, sp.p, sp.d, nullptr);
  EXPECT_LT(compareWithReference(sp.specCpp, sp.p, sp.d, ref).relErr(),
            errorBound(sp.specCpp.dtype));
  AttentionData swapped = sp.d;
  swapped.captures = {other};
  ReferenceResult off = referenceForward(sp.specCpp, sp.p, swapped, nullptr);
  EXPECT_GT(compareWithReference(sp.specCpp, sp.p, sp.d, off).relErr(),
            errorBound(sp.specCpp.dtype));

  // The backward on the same data (flashjit_backward_captured), the bias's
  // gradient added into what grad holds (here 1 everywhere); deterministic:
  // in the workspace flashjit_backward_captured_workspace_size gives, the
  // same bits on a second call.
  AttentionGrads g = makeRandomGrads(sp.specCpp, sp.p, sp.d, rng);
  sp.specCpp.captureGrads = 1;
  std::vector<float> first;
  for (int call = 0; call < 3; ++call) {
    const bool deterministic = call > 0;
    SCOPED_TRACE(::testing::Message() << "call " << call);
    sp.spec.deterministic = deterministic;
    sp.specCpp.deterministic = deterministic;
    flashjit_tensor dO = toC(g.dO), dq = toC(g.dq), dk = toC(g.dk),
                    dv = toC(g.dv);
    std::vector<float> dbias(bias.size(), 1.f);
    captured.grad = dbias.data();
    size_t bytes = 0;
    ASSERT_EQ(flashjit_backward_captured_workspace_size(
                  h, &sp.spec, 2, 4, 20, 33, &captured, 1, &bytes),
              FLASHJIT_OK)
        << lastError();
    std::vector<uint64_t> workspace(bytes / 8 + 1);
    ASSERT_EQ(flashjit_backward_captured(
                  h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o, &dO, sp.d.lse.data(),
                  &dq, &dk, &dv, 0.0, -1, -1, nullptr, workspace.data(), bytes,
                  &captured, 1, nullptr),
              FLASHJIT_OK)
        << lastError();
    for (float &x : dbias)
      x -= 1.f;
    g.captureGrads = {dbias};
    BackwardErrorReport err =
        compareBackward(sp.specCpp, sp.p, g,
                        referenceBackward(sp.specCpp, sp.p, sp.d, g, nullptr));
    EXPECT_EQ(err.nanCount, 0);
    EXPECT_TRUE(err.capturesChecked);
    EXPECT_LT(err.relErr(), errorBound(sp.specCpp.dtype));
    EXPECT_LT(err.captureRelErr, errorBound(sp.specCpp.dtype));
    EXPECT_GT(compareBackward(
                  sp.specCpp, sp.p, g,
                  referenceBackward(sp.specCpp, sp.p, swapped, g, nullptr))
                  .relErr(),
              errorBound(sp.specCpp.dtype));
    if (call == 1)
      first = dbias;
    if (call == 2)
      EXPECT_EQ(std::memcmp(first.data(), dbias.data(), 4 * dbias.size()), 0);
  }
}

/// The plan's output for the tensors \p c points at, next to
/// flashjit_forward_captured's on the same data: o and lse bit for bit.
void expectPlannedCall(flashjit_handle *h, SmallProblem &sp,
                       const flashjit_plan *plan, flashjit_captured c) {
  ASSERT_EQ(flashjit_forward_captured(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o,
                                      sp.d.lse.data(), 0.0, -1, -1, nullptr, &c,
                                      1, nullptr),
            FLASHJIT_OK)
      << lastError();
  const std::vector<uint16_t> o = *sp.d.o.buffer;
  const std::vector<float> lse = sp.d.lse;
  std::fill(sp.d.o.buffer->begin(), sp.d.o.buffer->end(), uint16_t(0x7e00));
  std::fill(sp.d.lse.begin(), sp.d.lse.end(), std::nanf(""));
  ASSERT_EQ(flashjit_plan_forward_captured(
                plan, sp.q.data, sp.k.data, sp.v.data, sp.o.data,
                sp.d.lse.data(), nullptr, nullptr, &c, 1, nullptr),
            FLASHJIT_OK)
      << lastError();
  EXPECT_EQ(*sp.d.o.buffer, o);
  EXPECT_EQ(std::memcmp(sp.d.lse.data(), lse.data(), 4 * lse.size()), 0);
}

TEST(CApiCaptured, PlanReadsEachCallsTensors) {
  Handle h;
  SmallProblem sp;
  uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<float> bias = withFullBias(sp, rng), other = randomBias(rng);
  flashjit_captured first = {bias.data(), int64_t(bias.size())};
  flashjit_plan *plan = nullptr;
  ASSERT_EQ(flashjit_plan_create_captured(h, &sp.spec, &sp.q, &sp.k, &sp.v,
                                          &sp.o, sp.d.lse.data(), 0.0, -1, -1,
                                          nullptr, &first, 1, nullptr, &plan),
            FLASHJIT_OK)
      << lastError();
  ASSERT_NE(plan, nullptr);
  // Each call's own tensor: the second's output is the reference's for
  // its data, not for the data the plan was made with.
  expectPlannedCall(h, sp, plan, first);
  flashjit_captured second = {other.data(), int64_t(other.size())};
  expectPlannedCall(h, sp, plan, second);
  sp.d.captures = {other};
  ReferenceResult ref = referenceForward(sp.specCpp, sp.p, sp.d, nullptr);
  EXPECT_LT(compareWithReference(sp.specCpp, sp.p, sp.d, ref).relErr(),
            errorBound(sp.specCpp.dtype));
  AttentionData made = sp.d;
  made.captures = {bias};
  EXPECT_GT(
      compareWithReference(sp.specCpp, sp.p, sp.d,
                           referenceForward(sp.specCpp, sp.p, made, nullptr))
          .relErr(),
      errorBound(sp.specCpp.dtype));

  auto expectError = [&](flashjit_status s, const std::string &text) {
    EXPECT_EQ(s, FLASHJIT_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(lastError().find(text), std::string::npos) << lastError();
  };
  float *lse = sp.d.lse.data();
  auto call = [&](const flashjit_captured *c, int64_t n) {
    return flashjit_plan_forward_captured(plan, sp.q.data, sp.k.data, sp.v.data,
                                          sp.o.data, lse, nullptr, nullptr, c,
                                          n, nullptr);
  };
  expectError(flashjit_plan_forward(plan, sp.q.data, sp.k.data, sp.v.data,
                                    sp.o.data, lse, nullptr, nullptr, nullptr),
              "spec.score_mod captures 1 tensors, the call gives 0 (give "
              "them with flashjit_plan_forward_captured)");
  flashjit_captured two[2] = {first, first};
  expectError(call(two, 2), "spec.score_mod captures 1 tensors, the call "
                            "gives 2");
  expectError(call(nullptr, 1), "captured is NULL");
  flashjit_captured null = {nullptr, first.size};
  expectError(call(&null, 1), "captured[0].data is NULL");
  flashjit_captured shorter = {bias.data(), first.size - 1};
  expectError(call(&shorter, 1), "captured[0].size is 2639, the plan's 2640");
  flashjit_plan_destroy(plan);

  // A plan of a spec that captures nothing takes no tensors.
  SmallProblem plain;
  flashjit_plan *dense = nullptr;
  ASSERT_EQ(flashjit_plan_create_captured(h, &plain.spec, &plain.q, &plain.k,
                                          &plain.v, &plain.o,
                                          plain.d.lse.data(), 0.0, -1, -1,
                                          nullptr, nullptr, 0, nullptr, &dense),
            FLASHJIT_OK)
      << lastError();
  expectError(flashjit_plan_forward_captured(
                  dense, plain.q.data, plain.k.data, plain.v.data, plain.o.data,
                  plain.d.lse.data(), nullptr, nullptr, &first, 1, nullptr),
              "captures 0 tensors, the call gives 1");
  flashjit_plan_destroy(dense);
}

TEST(CApiCaptured, BadCallsAreNamedErrors) {
  Handle h;
  SmallProblem sp;
  sp.spec.score_mod = kFullBias;
  std::vector<float> bias(size_t(4 * 20 * 33), 0.5f);
  auto call = [&](const flashjit_captured *c, int64_t n) {
    return flashjit_forward_captured(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o,
                                     sp.d.lse.data(), 0.0, -1, -1, nullptr, c,
                                     n, nullptr);
  };
  auto expectError = [&](flashjit_status s, const std::string &text) {
    EXPECT_EQ(s, FLASHJIT_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(lastError().find(text), std::string::npos) << lastError();
  };
  expectError(sp.run(h), "captures 1 tensors, the call gives 0 (give them "
                         "with flashjit_forward_captured)");
  flashjit_captured good = {bias.data(), int64_t(bias.size())};
  flashjit_captured two[2] = {good, good};
  expectError(call(two, 2), "captures 1 tensors, the call gives 2");
  expectError(call(nullptr, 1), "captured is NULL");
  flashjit_captured null = {nullptr, 4};
  expectError(call(&null, 1), "captured[0].data is NULL");
  flashjit_captured empty = {bias.data(), 0};
  expectError(call(&empty, 1), "captured[0].size must be in [1, 2^40]");
  flashjit_plan *plan = nullptr;
  expectError(flashjit_plan_create(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o,
                                   sp.d.lse.data(), 0.0, -1, -1, nullptr,
                                   nullptr, &plan),
              "captures 1 tensors, the call gives 0 (give them with "
              "flashjit_plan_create_captured)");
  EXPECT_EQ(plan, nullptr);
  std::mt19937_64 rng(1);
  AttentionGrads g = makeRandomGrads(sp.specCpp, sp.p, sp.d, rng);
  expectError(sp.backward(h, g), "captures 1 tensors, the call gives 0");
  auto backward = [&](const flashjit_captured *c, int64_t n) {
    flashjit_tensor dO = toC(g.dO), dq = toC(g.dq), dk = toC(g.dk),
                    dv = toC(g.dv);
    return flashjit_backward_captured(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o,
                                      &dO, sp.d.lse.data(), &dq, &dk, &dv, 0.0,
                                      -1, -1, nullptr, nullptr, 0, c, n,
                                      nullptr);
  };
  // Deterministic captured gradients take their words from the workspace:
  // flashjit_backward_workspace_size's bytes are too few.
  std::vector<float> grad(bias.size());
  flashjit_captured withGrad = {bias.data(), int64_t(bias.size()), grad.data()};
  sp.spec.deterministic = 1;
  size_t plain = 0, withWords = 0;
  ASSERT_EQ(flashjit_backward_workspace_size(h, &sp.spec, 2, 4, 20, 33, &plain),
            FLASHJIT_OK);
  ASSERT_EQ(flashjit_backward_captured_workspace_size(h, &sp.spec, 2, 4, 20, 33,
                                                      &withGrad, 1, &withWords),
            FLASHJIT_OK)
      << lastError();
  EXPECT_GE(withWords, plain + 16 * bias.size());
  std::vector<uint64_t> workspace(withWords / 8 + 1);
  {
    flashjit_tensor dO = toC(g.dO), dq = toC(g.dq), dk = toC(g.dk),
                    dv = toC(g.dv);
    expectError(flashjit_backward_captured(
                    h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o, &dO,
                    sp.d.lse.data(), &dq, &dk, &dv, 0.0, -1, -1, nullptr,
                    workspace.data(), plain, &withGrad, 1, nullptr),
                "flashjit_backward_captured_workspace_size: deterministic "
                "captured gradients");
  }
  flashjit_captured huge = {bias.data(), int64_t(1) << 31, grad.data()};
  expectError(flashjit_backward_captured_workspace_size(
                  h, &sp.spec, 2, 4, 20, 33, &huge, 1, &withWords),
              "captured[0].size is 2147483648");
  expectError(flashjit_backward_captured_workspace_size(
                  h, &sp.spec, 2, 4, 20, 33, &withGrad, 2, &withWords),
              "num_captured is 2, the spec's regions capture 1");
  sp.spec.deterministic = 0;
  // A spec without captured tensors takes none.
  sp.spec.score_mod = nullptr;
  expectError(call(&good, 1), "captures 0 tensors, the call gives 1");
  EXPECT_EQ(call(nullptr, 0), FLASHJIT_OK) << lastError();
}

/// keep where seg[i] == seg[j], seg captured tensor 1 (after the bias).
class SameSegment : public ScoreFunction {
public:
  /// The segment ids are captured tensor \p at.
  explicit SameSegment(size_t at = 1) : at(at) {}
  double apply(double, int64_t, int64_t, int64_t i, int64_t j,
               const Captures *captures, double *dScore) const override {
    *dScore = 0;
    const std::vector<float> &seg = (*captures)[at];
    return seg[size_t(i)] == seg[size_t(j)] ? 1.0 : 0.0;
  }

private:
  size_t at;
};

/// The document mask as a mask_mod region (AttentionCases.h).
const char *kSameSegment = test::kDocumentMaskRegion;

TEST(CApiCaptured, MaskModBesideTheBiasOnTheCpu) {
  Handle h;
  SmallProblem sp; // B 2, H 4, Nq 20, Nkv 33, gqa 2
  sp.spec.score_mod = kFullBias;
  sp.spec.mask_mod = kSameSegment;
  sp.specCpp.scoreMod = kCustomScoreMod;
  sp.specCpp.scoreFunction = std::make_shared<FullBias>(20, 33);
  sp.specCpp.maskModRegion = "(evaluated by SameSegment)";
  sp.specCpp.maskFunction = std::make_shared<SameSegment>();
  sp.specCpp.captures = 2;
  sp.specCpp.maskCaptures = 1;
  uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  std::vector<float> bias(size_t(4 * 20 * 33));
  for (float &x : bias)
    x = u(rng);
  std::vector<float> seg(33), shifted(33);
  for (int64_t j = 0; j < 33; ++j) {
    seg[size_t(j)] = float(j / 7);
    shifted[size_t(j)] = float((j + 3) / 7);
  }
  flashjit_captured captured[2] = {{bias.data(), int64_t(bias.size())},
                                   {seg.data(), int64_t(seg.size())}};
  // The bias alone is not enough: the mask's tensor is counted too.
  EXPECT_EQ(flashjit_forward_captured(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o,
                                      sp.d.lse.data(), 0.0, -1, -1, nullptr,
                                      captured, 1, nullptr),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("spec.score_mod and spec.mask_mod capture 2"),
            std::string::npos)
      << lastError();
  ASSERT_EQ(flashjit_forward_captured(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o,
                                      sp.d.lse.data(), 0.0, -1, -1, nullptr,
                                      captured, 2, nullptr),
            FLASHJIT_OK)
      << lastError();
  sp.d.captures = {bias, seg};
  ErrorReport same = compareWithReference(
      sp.specCpp, sp.p, sp.d, referenceForward(sp.specCpp, sp.p, sp.d, nullptr));
  EXPECT_EQ(same.nanCount, 0);
  EXPECT_LT(same.relErr(), errorBound(sp.specCpp.dtype));
  AttentionData other = sp.d;
  other.captures = {bias, shifted};
  EXPECT_GT(compareWithReference(sp.specCpp, sp.p, sp.d,
                                 referenceForward(sp.specCpp, sp.p, other,
                                                  nullptr))
                .relErr(),
            errorBound(sp.specCpp.dtype));
  // A gradient for the mask's tensor is refused by name.
  AttentionGrads g = makeRandomGrads(sp.specCpp, sp.p, sp.d, rng);
  flashjit_tensor dO = toC(g.dO), dq = toC(g.dq), dk = toC(g.dk),
                  dv = toC(g.dv);
  std::vector<float> dseg(seg.size());
  captured[1].grad = dseg.data();
  EXPECT_EQ(flashjit_backward_captured(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o,
                                       &dO, sp.d.lse.data(), &dq, &dk, &dv,
                                       0.0, -1, -1, nullptr, nullptr, 0,
                                       captured, 2, nullptr),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("no gradient"), std::string::npos)
      << lastError();
  size_t bytes = 0; // and by the workspace query, as the call would be
  EXPECT_EQ(flashjit_backward_captured_workspace_size(h, &sp.spec, 2, 4, 20, 33,
                                                      captured, 2, &bytes),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("no gradient"), std::string::npos) << lastError();
  captured[1].grad = nullptr;
  ASSERT_EQ(flashjit_backward_captured(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o,
                                       &dO, sp.d.lse.data(), &dq, &dk, &dv,
                                       0.0, -1, -1, nullptr, nullptr, 0,
                                       captured, 2, nullptr),
            FLASHJIT_OK)
      << lastError();
  BackwardErrorReport err = compareBackward(
      sp.specCpp, sp.p, g,
      referenceBackward(sp.specCpp, sp.p, sp.d, g, nullptr));
  EXPECT_EQ(err.nanCount, 0);
  EXPECT_LT(err.relErr(), errorBound(sp.specCpp.dtype));
}

} // namespace

/// flashjit_mask_blocks on the CPU: the layout of a document mask over
/// captured segment ids, broadcast over batch and heads, listed and marked
/// full as the segments say (entries past a count untouched); the forward
/// on it matches the reference; bad layouts and specs are named errors.
TEST(CApiCaptured, MaskBlocksClassifyOnTheCpu) {
  Handle h;
  SmallProblem sp; // B 2, H 4, Nq 20, Nkv 33, gqa 2
  sp.spec.mask_mod = kSameSegment;
  sp.spec.block_sparse = 1;
  sp.spec.sparse_block = 16;
  sp.specCpp.maskModRegion = "(evaluated by SameSegment)";
  sp.specCpp.maskFunction = std::make_shared<SameSegment>(0);
  sp.specCpp.captures = sp.specCpp.maskCaptures = 1;
  // Segments 0..15, 16..24, 25..32; Q blocks [0, 16), [16, 20); KV blocks
  // [0, 16), [16, 32), [32, 33).
  std::vector<float> seg(33);
  for (int64_t j = 0; j < 33; ++j)
    seg[size_t(j)] = j < 16 ? 0.f : j < 25 ? 1.f : 2.f;
  flashjit_captured captured[1] = {{seg.data(), int64_t(seg.size())}};
  std::vector<int32_t> counts(2, 77), indices(2 * 3, 77);
  flashjit_layout layout = {counts.data(), indices.data(), 1, 1, 2, 3};
  ASSERT_EQ(flashjit_mask_blocks(h, &sp.spec, 2, 4, 20, 33, &layout, captured,
                                 1, nullptr),
            FLASHJIT_OK)
      << lastError();
  // Q block 0 (segment 0): KV block 0, whole. Q block 1 (rows 16..19,
  // segment 1): KV block 1, partly (keys 16..24 of 16..31). The entries
  // past a count are unspecified.
  EXPECT_EQ(counts, (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(indices[0], ~0);
  EXPECT_EQ(indices[3], 1);
  ASSERT_EQ(flashjit_forward_captured(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o,
                                      sp.d.lse.data(), 0.0, -1, -1, &layout,
                                      captured, 1, nullptr),
            FLASHJIT_OK)
      << lastError();
  sp.d.captures = {seg};
  ErrorReport same =
      compareWithReference(sp.specCpp, sp.p, sp.d,
                           referenceForward(sp.specCpp, sp.p, sp.d, nullptr));
  EXPECT_EQ(same.nanCount, 0);
  EXPECT_LT(same.relErr(), errorBound(sp.specCpp.dtype));
  // A layout that does not broadcast, a missing one, a dense spec: named.
  flashjit_layout wide = layout;
  wide.batch = 3;
  EXPECT_EQ(flashjit_mask_blocks(h, &sp.spec, 2, 4, 20, 33, &wide, captured, 1,
                                 nullptr),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flashjit_mask_blocks(h, &sp.spec, 2, 4, 20, 33, nullptr, captured,
                                 1, nullptr),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  sp.spec.block_sparse = 0;
  EXPECT_EQ(flashjit_mask_blocks(h, &sp.spec, 2, 4, 20, 33, &layout, captured,
                                 1, nullptr),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("spec.block_sparse is 0"), std::string::npos)
      << lastError();

  // A varlen batch (flashjit_mask_blocks_varlen): sequences of 20 and 9
  // queries, 33 and 12 keys, each classified on its own positions. Sequence
  // 1 (keys 0..11 all in segment 0) keeps every key of its one Q block.
  sp.spec.block_sparse = 1;
  sp.spec.varlen = 1;
  const int32_t cuQ[] = {0, 20, 29}, cuKV[] = {0, 33, 45};
  std::vector<int32_t> vcounts(2 * 2, 77), vindices(2 * 2 * 3, 77);
  flashjit_layout vlayout = {vcounts.data(), vindices.data(), 2, 1, 2, 3};
  flashjit_varlen varlen = {cuQ, cuKV, 2, 20, 33, &vlayout};
  ASSERT_EQ(flashjit_mask_blocks_varlen(h, &sp.spec, 4, &varlen, captured, 1,
                                        nullptr),
            FLASHJIT_OK)
      << lastError();
  EXPECT_EQ(vcounts, (std::vector<int32_t>{1, 1, 1, 0}));
  EXPECT_EQ(vindices[0], ~0);
  EXPECT_EQ(vindices[3], 1);
  EXPECT_EQ(vindices[6], ~0);
  // The dense entry point refuses a varlen spec, this one a missing layout
  // or a layout that broadcasts over the sequences.
  EXPECT_EQ(flashjit_mask_blocks(h, &sp.spec, 2, 4, 20, 33, &layout, captured,
                                 1, nullptr),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("flashjit_mask_blocks_varlen"), std::string::npos)
      << lastError();
  varlen.layout = &layout;
  EXPECT_EQ(flashjit_mask_blocks_varlen(h, &sp.spec, 4, &varlen, captured, 1,
                                        nullptr),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  varlen.layout = nullptr;
  EXPECT_EQ(flashjit_mask_blocks_varlen(h, &sp.spec, 4, &varlen, captured, 1,
                                        nullptr),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
}
