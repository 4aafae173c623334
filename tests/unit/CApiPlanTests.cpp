//===- CApiPlanTests.cpp - Prepared forward calls through the C API -------===//
//
/// \file
/// flashjit_plan_create / flashjit_plan_forward / flashjit_plan_destroy on
/// a CPU handle (the CUDA path is covered by the Python GPU tests, where
/// every torch forward runs through a plan, and by flashjit-plan-bench):
/// a plan's output is bit for bit flashjit_forward's on the same inputs,
/// for new data on every call (masks, GQA, strided O, block-sparse), it
/// outlives its handle, and every bad argument is a named error.
//
//===----------------------------------------------------------------------===//

#include "CApiTestUtil.h"
#include "flashjit.h"

#include "kernels/GpuGeometry.h"
#include "kernels/HostTensor.h"

#include <cmath>
#include <cstring>
#include <gtest/gtest.h>
#include <random>
#include <string>
#include <vector>

using namespace flashjit;
using namespace flashjit::capitest;

namespace {

/// One planned problem: its spec and shape, and a layout when
/// block-sparse.
struct PlanCase {
  AttentionSpec spec;
  Problem p;
  bool stridedO = false;    ///< O laid out as (B, N, H, dv)
  double density = -1;      ///< >= 0: block-sparse
  int64_t wl = -1, wr = -1; ///< the C API's window arguments
};

/// O (B, H, Nq, dv) as \p c lays it out, filled with NaNs.
HalfTensor makeOutput(const PlanCase &c) {
  const Problem &p = c.p;
  int64_t dv = c.spec.headDimV;
  HalfTensor o = HalfTensor::packed({p.batch, p.heads, p.seqLenQ, dv});
  std::fill(o.buffer->begin(), o.buffer->end(),
            floatToHalf(c.spec.dtype, std::nanf("")));
  if (c.stridedO)
    o.strides = {p.seqLenQ * p.heads * dv, dv, p.heads * dv, 1};
  return o;
}

/// Runs \p c through one plan on three sets of inputs and checks each
/// against flashjit_forward on the same inputs, bit for bit (o and lse).
void expectPlanMatchesForward(const PlanCase &c, uint64_t seed) {
  Handle h;
  std::mt19937_64 rng(seed);
  const Problem &p = c.p;
  BlockSparseLayout layout;
  if (c.density >= 0)
    layout = BlockSparseLayout::random(
        p.batch, p.heads, ceilDiv(p.seqLenQ, c.spec.sparseBlock),
        ceilDiv(p.seqLenKV, c.spec.sparseBlock), c.density, seed);
  flashjit_layout cl = toC(layout);
  const flashjit_layout *lp = c.density >= 0 ? &cl : nullptr;
  flashjit_spec spec = toC(c.spec);

  AttentionData first = makeRandomInputs(c.spec, p, QKVLayout::Separate, rng);
  HalfTensor firstO = makeOutput(c);
  flashjit_tensor q = toC(first.q), k = toC(first.k), v = toC(first.v),
                  o = toC(firstO);
  flashjit_plan *plan = nullptr;
  ASSERT_EQ(flashjit_plan_create(h, &spec, &q, &k, &v, &o, first.lse.data(),
                                 p.scale, c.wl, c.wr, lp, nullptr, &plan),
            FLASHJIT_OK)
      << lastError();
  ASSERT_NE(plan, nullptr);
  int64_t kernels = flashjit_cached_kernels(h);
  EXPECT_EQ(kernels, 1); // the plan compiled the kernel into the handle

  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    AttentionData d = makeRandomInputs(c.spec, p, QKVLayout::Separate, rng);
    HalfTensor planned = makeOutput(c), direct = makeOutput(c);
    std::vector<float> plannedLse(d.lse.size(), NAN), directLse = plannedLse;
    ASSERT_EQ(flashjit_plan_forward(plan, d.q.buffer->data() + d.q.offset,
                                    d.k.buffer->data() + d.k.offset,
                                    d.v.buffer->data() + d.v.offset,
                                    planned.buffer->data(), plannedLse.data(),
                                    lp ? cl.counts : nullptr,
                                    lp ? cl.indices : nullptr, nullptr),
              FLASHJIT_OK)
        << lastError();
    flashjit_tensor dq = toC(d.q), dk = toC(d.k), dv = toC(d.v),
                    dout = toC(direct);
    ASSERT_EQ(flashjit_forward(h, &spec, &dq, &dk, &dv, &dout, directLse.data(),
                               p.scale, c.wl, c.wr, lp, nullptr),
              FLASHJIT_OK)
        << lastError();
    EXPECT_EQ(*planned.buffer, *direct.buffer) << "o differs";
    EXPECT_EQ(std::memcmp(plannedLse.data(), directLse.data(),
                          plannedLse.size() * sizeof(float)),
              0)
        << "lse differs";
    // Not a constant: the inputs changed, so must the output.
    EXPECT_FALSE(std::isnan(halfToFloat(c.spec.dtype, (*planned.buffer)[0])));
  }
  EXPECT_EQ(flashjit_cached_kernels(h), kernels); // no new kernel per call
  flashjit_plan_destroy(plan);
}

PlanCase planCase(int64_t dqk, int64_t dv, DType dtype, MaskKind mask,
                  int64_t gqa, int64_t batch, int64_t heads, int64_t nq,
                  int64_t nkv) {
  PlanCase c;
  c.spec.headDimQK = dqk;
  c.spec.headDimV = dv;
  c.spec.dtype = dtype;
  c.spec.mask = mask;
  c.spec.gqaGroup = gqa;
  c.p.batch = batch;
  c.p.heads = heads;
  c.p.seqLenQ = nq;
  c.p.seqLenKV = nkv;
  return c;
}

/// A dense CPU plan of SmallProblem's shapes.
struct SmallPlan {
  Handle h;
  SmallProblem sp;
  flashjit_plan *plan = nullptr;
  SmallPlan() {
    EXPECT_EQ(flashjit_plan_create(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o,
                                   sp.d.lse.data(), 0.0, -1, -1, nullptr,
                                   nullptr, &plan),
              FLASHJIT_OK)
        << lastError();
  }
  ~SmallPlan() { flashjit_plan_destroy(plan); }
  flashjit_status run(const void *q, const void *k, const void *v, void *o,
                      const int32_t *counts = nullptr,
                      const int32_t *indices = nullptr) {
    return flashjit_plan_forward(plan, q, k, v, o, sp.d.lse.data(), counts,
                                 indices, nullptr);
  }
};

} // namespace

TEST(CApiPlan, MatchesForwardOnNewInputs) {
  std::vector<PlanCase> cases = {
      planCase(64, 64, DType::BF16, MaskKind::None, 1, 2, 3, 100, 100),
      planCase(96, 96, DType::FP16, MaskKind::Causal, 2, 1, 4, 77, 130),
      planCase(40, 24, DType::BF16, MaskKind::SlidingWindow, 2, 1, 4, 130, 77),
      planCase(7, 33, DType::FP16, MaskKind::Causal, 1, 2, 2, 65, 65),
  };
  cases[2].p.windowLeft = cases[2].wl = 9;
  cases[2].p.windowRight = cases[2].wr = 3;
  cases[3].p.scale = 0.3;
  cases[3].stridedO = true;
  uint64_t seed = std::random_device{}();
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].spec.name() + " seed " + std::to_string(seed + i));
    expectPlanMatchesForward(cases[i], seed + i);
  }
}

TEST(CApiPlan, BlockSparse) {
  for (double density : {0.0, 0.5}) {
    PlanCase c =
        planCase(32, 32, DType::FP16, MaskKind::None, 1, 2, 2, 200, 150);
    c.spec.blockSparse = true;
    c.spec.sparseBlock = 64;
    c.density = density;
    SCOPED_TRACE(density);
    expectPlanMatchesForward(c, std::random_device{}());
  }
}

TEST(CApiPlan, OutlivesItsHandle) {
  SmallProblem sp;
  flashjit_handle *h = nullptr;
  ASSERT_EQ(flashjit_create(&h, FLASHJIT_DEVICE_CPU), FLASHJIT_OK);
  flashjit_plan *plan = nullptr;
  ASSERT_EQ(flashjit_plan_create(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o,
                                 sp.d.lse.data(), 0.0, -1, -1, nullptr, nullptr,
                                 &plan),
            FLASHJIT_OK)
      << lastError();
  flashjit_destroy(h);
  std::vector<uint16_t> before = *sp.d.o.buffer;
  ASSERT_EQ(flashjit_plan_forward(plan, sp.q.data, sp.k.data, sp.v.data,
                                  sp.o.data, nullptr, nullptr, nullptr,
                                  nullptr),
            FLASHJIT_OK)
      << lastError();
  EXPECT_NE(*sp.d.o.buffer, before); // o was written
  flashjit_plan_destroy(plan);
  flashjit_plan_destroy(nullptr); // fine
}

TEST(CApiPlanErrors, CreateChecksAsForwardDoes) {
  Handle h;
  SmallProblem sp;
  flashjit_plan *plan = reinterpret_cast<flashjit_plan *>(0x1);
  sp.spec.head_dim_qk = sp.spec.head_dim_v = 600;
  EXPECT_EQ(flashjit_plan_create(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o,
                                 nullptr, 0.0, -1, -1, nullptr, nullptr, &plan),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(plan, nullptr); // NULL on failure
  EXPECT_NE(lastError().find("flashjit_plan_create: spec.head_dim"),
            std::string::npos)
      << lastError();
  SmallProblem ok;
  ok.q.strides[3] = 2;
  EXPECT_EQ(flashjit_plan_create(h, &ok.spec, &ok.q, &ok.k, &ok.v, &ok.o,
                                 nullptr, 0.0, -1, -1, nullptr, nullptr, &plan),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("innermost"), std::string::npos) << lastError();
  ok.q.strides[3] = 1;
  EXPECT_EQ(flashjit_plan_create(h, &ok.spec, &ok.q, &ok.k, &ok.v, &ok.o,
                                 nullptr, 0.0, 3, -1, nullptr, nullptr, &plan),
            FLASHJIT_ERROR_INVALID_ARGUMENT); // a window without the mask
  EXPECT_NE(lastError().find("window_left"), std::string::npos) << lastError();
  EXPECT_EQ(flashjit_plan_create(nullptr, &ok.spec, &ok.q, &ok.k, &ok.v, &ok.o,
                                 nullptr, 0.0, -1, -1, nullptr, nullptr, &plan),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("handle is NULL"), std::string::npos);
  EXPECT_EQ(flashjit_plan_create(h, &ok.spec, &ok.q, &ok.k, &ok.v, &ok.o,
                                 nullptr, 0.0, -1, -1, nullptr, nullptr,
                                 nullptr),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("plan is NULL"), std::string::npos);
  EXPECT_EQ(flashjit_cached_kernels(h), 0); // nothing compiled for a bad call
}

TEST(CApiPlanErrors, ForwardNamesTheBadPointer) {
  SmallPlan s;
  ASSERT_NE(s.plan, nullptr);
  EXPECT_EQ(flashjit_plan_forward(nullptr, s.sp.q.data, s.sp.k.data,
                                  s.sp.v.data, s.sp.o.data, nullptr, nullptr,
                                  nullptr, nullptr),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("flashjit_plan_forward: plan is NULL"),
            std::string::npos)
      << lastError();
  const void *q = s.sp.q.data, *k = s.sp.k.data, *v = s.sp.v.data;
  void *o = s.sp.o.data;
  struct {
    const void *q, *k, *v;
    void *o;
    const char *named;
  } bad[] = {{nullptr, k, v, o, "q is NULL"},
             {q, nullptr, v, o, "k is NULL"},
             {q, k, nullptr, o, "v is NULL"},
             {q, k, v, nullptr, "o is NULL"}};
  for (const auto &b : bad) {
    EXPECT_EQ(s.run(b.q, b.k, b.v, b.o), FLASHJIT_ERROR_INVALID_ARGUMENT)
        << b.named;
    EXPECT_NE(lastError().find(b.named), std::string::npos) << lastError();
  }
  int32_t dummy[4] = {};
  EXPECT_EQ(s.run(q, k, v, o, dummy, dummy), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("the plan is dense"), std::string::npos)
      << lastError();
  EXPECT_EQ(s.run(q, k, v, o), FLASHJIT_OK) << lastError();
}

TEST(CApiPlanErrors, BlockSparseChecksTheLayoutPerCall) {
  Handle h;
  SmallProblem sp;
  sp.spec.block_sparse = 1;
  sp.spec.sparse_block = 16;
  BlockSparseLayout l = twoByThreeLayout();
  flashjit_layout cl = toC(l);
  flashjit_plan *plan = nullptr;
  ASSERT_EQ(flashjit_plan_create(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o,
                                 nullptr, 0.0, -1, -1, &cl, nullptr, &plan),
            FLASHJIT_OK)
      << lastError();
  auto run = [&](const int32_t *counts, const int32_t *indices) {
    return flashjit_plan_forward(plan, sp.q.data, sp.k.data, sp.v.data,
                                 sp.o.data, nullptr, counts, indices, nullptr);
  };
  EXPECT_EQ(run(l.counts.data(), l.indices.data()), FLASHJIT_OK) << lastError();
  EXPECT_EQ(run(nullptr, nullptr), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("the plan is block-sparse"), std::string::npos)
      << lastError();
  std::vector<int32_t> twice = l.indices;
  twice[1] = twice[0]; // Q block 0 lists KV block 0 twice
  EXPECT_EQ(run(l.counts.data(), twice.data()),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("listed twice"), std::string::npos) << lastError();
  flashjit_plan_destroy(plan);
}
