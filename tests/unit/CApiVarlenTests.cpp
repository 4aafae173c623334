//===- CApiVarlenTests.cpp - Variable-length batches through the C API ----===//
//
/// \file
/// flashjit_forward_varlen and flashjit_backward_varlen (version 8) on the
/// CPU handle: token-major packed sequences (one of them without keys), a
/// causal GQA spec, checked sequence by sequence against float64
/// (kernels/Varlen.h); the check fails for a wrong offset array; and the
/// named errors: a varlen spec through flashjit_forward, offsets for a
/// spec without varlen, a batch in q, NULL offsets, bad offsets, a plan.
//
//===----------------------------------------------------------------------===//

#include "tests/unit/CApiTestUtil.h"

#include "kernels/Varlen.h"

#include <gtest/gtest.h>

#include <random>

using namespace flashjit;
using namespace flashjit::capitest;

namespace {

/// A causal GQA varlen batch of four sequences (the third has no keys).
struct VarlenProblem {
  AttentionSpec spec;
  Problem problem;
  AttentionData data;
  flashjit_varlen c{};

  VarlenProblem() {
    spec.headDimQK = 32;
    spec.headDimV = 48;
    spec.mask = MaskKind::Causal;
    spec.gqaGroup = 2;
    spec.varlen = true;
    Problem like;
    like.heads = 4;
    const std::vector<int64_t> lensQ = {9, 30, 5, 1}, lensKV = {20, 30, 0, 7};
    problem = varlenProblem(like, lensQ, lensKV);
    std::mt19937_64 rng(std::random_device{}());
    data = makeRandomVarlenInputs(spec, problem, lensQ, lensKV, rng);
    c.cu_seqlens_q = data.cuSeqQ.data();
    c.cu_seqlens_kv = data.cuSeqKV.data();
    c.batch = problem.batch;
    c.max_seqlen_q = problem.seqLenQ;
    c.max_seqlen_kv = problem.seqLenKV;
  }
  flashjit_status forward(flashjit_handle *h, const flashjit_varlen *v) {
    flashjit_spec s = toC(spec);
    s.varlen = 1;
    flashjit_tensor q = toC(data.q), k = toC(data.k), vt = toC(data.v),
                    o = toC(data.o);
    return flashjit_forward_varlen(h, &s, &q, &k, &vt, &o, data.lse.data(), 0.0,
                                   -1, -1, v, nullptr, 0, nullptr);
  }
  /// The backward of forward()'s output for \p g's dO, into \p g.
  flashjit_status backward(flashjit_handle *h, AttentionGrads &g) {
    flashjit_spec s = toC(spec);
    s.varlen = 1;
    flashjit_tensor q = toC(data.q), k = toC(data.k), v = toC(data.v),
                    o = toC(data.o), dO = toC(g.dO), dq = toC(g.dq),
                    dk = toC(g.dk), dv = toC(g.dv);
    return flashjit_backward_varlen(h, &s, &q, &k, &v, &o, &dO, data.lse.data(),
                                    &dq, &dk, &dv, 0.0, -1, -1, &c, nullptr, 0,
                                    nullptr, 0, nullptr);
  }
};

TEST(CApiVarlen, ForwardAndBackwardOnTheCpu) {
  Handle h;
  VarlenProblem vp;
  ASSERT_EQ(vp.forward(h, &vp.c), FLASHJIT_OK) << lastError();
  ErrorReport e = checkVarlenForward(vp.spec, vp.problem, vp.data);
  EXPECT_EQ(e.nanCount, 0);
  EXPECT_LT(e.relErr(), errorBound(vp.spec.dtype));

  std::mt19937_64 rng(std::random_device{}());
  AttentionGrads g = makeRandomGrads(vp.spec, vp.problem, vp.data, rng);
  ASSERT_EQ(vp.backward(h, g), FLASHJIT_OK) << lastError();
  BackwardErrorReport be = checkVarlenBackward(vp.spec, vp.problem, vp.data, g);
  EXPECT_EQ(be.nanCount, 0);
  EXPECT_LT(be.relErr(), errorBound(vp.spec.dtype));

  // The check fails for offsets other than the kernel's: the forward's
  // output read as if the first two sequences were split elsewhere.
  AttentionData shifted = vp.data;
  shifted.cuSeqQ[1] += 3;
  shifted.cuSeqKV[1] += 3;
  EXPECT_GT(checkVarlenForward(vp.spec, vp.problem, shifted).relErr(), 1e-2);
}

/// flashjit_varlen.layout (version 9): a block-sparse varlen spec runs
/// under a layout per sequence, forward and backward, each sequence
/// against its part of the layout; checked without it, the output fails.
TEST(CApiVarlen, BlockSparseLayoutPerSequence) {
  Handle h;
  VarlenProblem vp;
  vp.spec.blockSparse = true;
  vp.spec.sparseBlock = 16;
  BlockSparseLayout l = BlockSparseLayout::random(
      vp.problem.batch, vp.problem.heads, (vp.problem.seqLenQ + 15) / 16,
      (vp.problem.seqLenKV + 15) / 16, 0.5, std::random_device{}());
  flashjit_layout cl = toC(l);
  vp.c.layout = &cl;
  ASSERT_EQ(vp.forward(h, &vp.c), FLASHJIT_OK) << lastError();
  ErrorReport e =
      checkVarlenForward(vp.spec, vp.problem, vp.data, 1e300, nullptr, &l);
  EXPECT_EQ(e.nanCount, 0);
  EXPECT_LT(e.relErr(), errorBound(vp.spec.dtype));
  AttentionSpec dense = vp.spec;
  dense.blockSparse = false;
  EXPECT_GT(checkVarlenForward(dense, vp.problem, vp.data).relErr(), 1e-2);
  std::mt19937_64 rng(std::random_device{}());
  AttentionGrads g = makeRandomGrads(vp.spec, vp.problem, vp.data, rng);
  ASSERT_EQ(vp.backward(h, g), FLASHJIT_OK) << lastError();
  BackwardErrorReport be =
      checkVarlenBackward(vp.spec, vp.problem, vp.data, g, 1e300, &l);
  EXPECT_EQ(be.nanCount, 0);
  EXPECT_LT(be.relErr(), errorBound(vp.spec.dtype));
  // With the layout's KV-major transpose (version 13): the same bits; a
  // transpose of another layout is refused.
  std::mt19937_64 again(0);
  AttentionGrads first = makeRandomGrads(vp.spec, vp.problem, vp.data, again);
  ASSERT_EQ(vp.backward(h, first), FLASHJIT_OK) << lastError();
  BlockSparseLayout t = l.transposed();
  flashjit_layout ct = toC(t);
  vp.c.kv_layout = &ct;
  again.seed(0);
  AttentionGrads given = makeRandomGrads(vp.spec, vp.problem, vp.data, again);
  ASSERT_EQ(vp.backward(h, given), FLASHJIT_OK) << lastError();
  EXPECT_EQ(*given.dq.buffer, *first.dq.buffer);
  EXPECT_EQ(*given.dk.buffer, *first.dk.buffer);
  EXPECT_EQ(*given.dv.buffer, *first.dv.buffer);
  BlockSparseLayout other =
      BlockSparseLayout::random(l.batch, l.heads, l.qBlocks, l.kvBlocks, 0.0, 1)
          .transposed();
  ASSERT_NE(other.counts, t.counts);
  flashjit_layout co = toC(other);
  vp.c.kv_layout = &co;
  EXPECT_EQ(vp.backward(h, given), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("not the layout's KV-major transpose"),
            std::string::npos)
      << lastError();
  vp.c.kv_layout = nullptr;
  // A block-sparse spec without the layout: a named error.
  vp.c.layout = nullptr;
  EXPECT_EQ(vp.forward(h, &vp.c), FLASHJIT_ERROR_INVALID_ARGUMENT);
}

TEST(CApiVarlen, NamedErrors) {
  Handle h;
  VarlenProblem vp;
  flashjit_spec s = toC(vp.spec);
  s.varlen = 1;
  flashjit_tensor q = toC(vp.data.q), k = toC(vp.data.k), v = toC(vp.data.v),
                  o = toC(vp.data.o);
  auto expectError = [&](flashjit_status st, const char *needle) {
    EXPECT_EQ(st, FLASHJIT_ERROR_INVALID_ARGUMENT) << needle;
    EXPECT_NE(lastError().find(needle), std::string::npos) << lastError();
  };
  expectError(flashjit_forward(h, &s, &q, &k, &v, &o, vp.data.lse.data(), 0.0,
                               -1, -1, nullptr, nullptr),
              "run it with flashjit_forward_varlen");
  expectError(vp.forward(h, nullptr), "varlen is NULL");
  flashjit_spec dense = s;
  dense.varlen = 0;
  expectError(flashjit_forward_varlen(h, &dense, &q, &k, &v, &o,
                                      vp.data.lse.data(), 0.0, -1, -1, &vp.c,
                                      nullptr, 0, nullptr),
              "a flashjit_varlen given for a spec without varlen");
  flashjit_varlen noOffsets = vp.c;
  noOffsets.cu_seqlens_kv = nullptr;
  expectError(vp.forward(h, &noOffsets),
              "cu_seqlens_q and cu_seqlens_kv must not be NULL");
  std::vector<int32_t> bad = vp.data.cuSeqQ;
  bad[2] = bad[1] - 1;
  flashjit_varlen decreasing = vp.c;
  decreasing.cu_seqlens_q = bad.data();
  expectError(vp.forward(h, &decreasing),
              "cu_seqlens_q: sequence 1 has length");
  flashjit_varlen tooShort = vp.c;
  tooShort.max_seqlen_q = 10; // sequence 1 has 30 queries
  expectError(vp.forward(h, &tooShort), "lengths must be in [0, 10]");
  flashjit_tensor batched = q;
  batched.shape[0] = 2;
  expectError(flashjit_forward_varlen(h, &s, &batched, &k, &v, &o,
                                      vp.data.lse.data(), 0.0, -1, -1, &vp.c,
                                      nullptr, 0, nullptr),
              "varlen: q holds the sequences packed");
  flashjit_plan *plan = nullptr;
  expectError(flashjit_plan_create(h, &s, &q, &k, &v, &o, vp.data.lse.data(),
                                   0.0, -1, -1, nullptr, nullptr, &plan),
              "plans do not take variable-length batches");
}

} // namespace
