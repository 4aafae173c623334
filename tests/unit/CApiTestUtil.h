//===- CApiTestUtil.h - Helpers of the C API's tests ------------*- C++ -*-===//
//
/// \file
/// What the C API's test files share: a handle per test, the C views of the
/// C++ spec, tensors and layouts of flashjit_kernels, a small valid problem
/// for the error tests, and its gradients' check against float64.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_TESTS_UNIT_CAPITESTUTIL_H
#define FLASHJIT_TESTS_UNIT_CAPITESTUTIL_H

#include "flashjit.h"

#include "kernels/GpuGeometry.h"
#include "kernels/HostTensor.h"

#include <gtest/gtest.h>
#include <random>
#include <string>

namespace flashjit::capitest {

/// One handle per test.
struct Handle {
  flashjit_handle *h = nullptr;
  explicit Handle(int device = FLASHJIT_DEVICE_CPU) {
    flashjit_status s = flashjit_create(&h, device);
    EXPECT_EQ(s, FLASHJIT_OK) << flashjit_last_error(nullptr);
  }
  ~Handle() { flashjit_destroy(h); }
  operator flashjit_handle *() const { return h; }
};

inline flashjit_spec toC(const AttentionSpec &s) {
  flashjit_spec c;
  flashjit_spec_init(&c);
  c.head_dim_qk = s.headDimQK;
  c.head_dim_v = s.headDimV;
  c.dtype = s.dtype == DType::BF16 ? FLASHJIT_DTYPE_BF16 : FLASHJIT_DTYPE_FP16;
  c.mask = s.mask == MaskKind::None     ? FLASHJIT_MASK_NONE
           : s.mask == MaskKind::Causal ? FLASHJIT_MASK_CAUSAL
                                        : FLASHJIT_MASK_SLIDING_WINDOW;
  c.gqa = s.gqaGroup;
  c.block_sparse = s.blockSparse ? 1 : 0;
  c.sparse_block = s.sparseBlock;
  c.deterministic = s.deterministic ? 1 : 0;
  c.score_mod = s.scoreMod.empty() ? nullptr : s.scoreMod.c_str();
  return c;
}

inline flashjit_tensor toC(HalfTensor &t) {
  flashjit_tensor c;
  c.data = t.buffer->data() + t.offset;
  for (int i = 0; i < 4; ++i) {
    c.shape[i] = t.shape[i];
    c.strides[i] = t.strides[i];
  }
  return c;
}

/// The 2 x 3 block layout of the sparse tests (one batch and head): Q block
/// 0 sees KV blocks 0 and 1, Q block 1 sees blocks 1 and 2.
inline BlockSparseLayout twoByThreeLayout() {
  return BlockSparseLayout::fromDense(1, 1, 2, 3,
                                      {1, 1, 0, //
                                       0, 1, 1});
}

inline flashjit_layout toC(const BlockSparseLayout &l) {
  return {l.counts.data(), l.indices.data(), l.batch,
          l.heads,         l.qBlocks,        l.kvBlocks};
}

/// A valid fp16 problem's tensors, for the error tests.
struct SmallProblem {
  AttentionSpec specCpp;
  Problem p;
  AttentionData d;
  flashjit_spec spec;
  flashjit_tensor q, k, v, o;
  SmallProblem() {
    specCpp.headDimQK = specCpp.headDimV = 32;
    specCpp.dtype = DType::FP16;
    specCpp.gqaGroup = 2;
    p.batch = 2;
    p.heads = 4;
    p.seqLenQ = 20;
    p.seqLenKV = 33;
    std::mt19937_64 rng(7);
    d = makeRandomInputs(specCpp, p, QKVLayout::Separate, rng);
    spec = toC(specCpp);
    q = toC(d.q);
    k = toC(d.k);
    v = toC(d.v);
    o = toC(d.o);
  }
  flashjit_status run(flashjit_handle *h, const flashjit_layout *l = nullptr,
                      int64_t wl = -1, int64_t wr = -1) {
    return flashjit_forward(h, &spec, &q, &k, &v, &o, d.lse.data(), 0.0, wl, wr,
                            l, nullptr);
  }
  /// The backward of the forward run() made, for \p g's dO, into \p g.
  flashjit_status backward(flashjit_handle *h, AttentionGrads &g,
                           const flashjit_layout *l = nullptr,
                           void *workspace = nullptr,
                           size_t workspaceBytes = 0) {
    flashjit_tensor dO = toC(g.dO), dq = toC(g.dq), dk = toC(g.dk),
                    dv = toC(g.dv);
    return flashjit_backward(h, &spec, &q, &k, &v, &o, &dO, d.lse.data(), &dq,
                             &dk, &dv, 0.0, -1, -1, l, workspace,
                             workspaceBytes, nullptr);
  }
  /// backward() with the layout's KV-major transpose \p kv
  /// (flashjit_backward_kv_major).
  flashjit_status backwardKvMajor(flashjit_handle *h, AttentionGrads &g,
                                  const flashjit_layout *l,
                                  const flashjit_layout *kv) {
    flashjit_tensor dO = toC(g.dO), dq = toC(g.dq), dk = toC(g.dk),
                    dv = toC(g.dv);
    return flashjit_backward_kv_major(h, &spec, &q, &k, &v, &o, &dO,
                                      d.lse.data(), &dq, &dk, &dv, 0.0, -1, -1,
                                      l, kv, nullptr, 0, nullptr, 0, nullptr);
  }
  /// flashjit_backward_workspace_size for this problem.
  size_t workspaceBytes(flashjit_handle *h) {
    size_t bytes = 0;
    EXPECT_EQ(flashjit_backward_workspace_size(h, &spec, p.batch, p.heads,
                                               p.seqLenQ, p.seqLenKV, &bytes),
              FLASHJIT_OK)
        << flashjit_last_error(nullptr);
    return bytes;
  }
};

inline std::string lastError() { return flashjit_last_error(nullptr); }

/// dQ, dK, dV of \p sp against float64 (\p layout: its block-sparse one).
inline void expectGradsMatch(const SmallProblem &sp, const AttentionGrads &g,
                             const BlockSparseLayout *layout = nullptr) {
  BackwardReference ref = referenceBackward(sp.specCpp, sp.p, sp.d, g, layout);
  BackwardErrorReport err = compareBackward(sp.specCpp, sp.p, g, ref);
  EXPECT_EQ(err.nanCount, 0);
  EXPECT_LT(err.relErr(), errorBound(sp.specCpp.dtype))
      << "dq " << err.dqRelErr << " dk " << err.dkRelErr << " dv "
      << err.dvRelErr;
}

/// \p sp made block-sparse with blocks of \p block (spec and C++ spec).
inline void makeBlockSparse(SmallProblem &sp, int64_t block) {
  sp.spec.block_sparse = 1;
  sp.spec.sparse_block = block;
  sp.specCpp.blockSparse = true;
  sp.specCpp.sparseBlock = block;
}

} // namespace flashjit::capitest

#endif // FLASHJIT_TESTS_UNIT_CAPITESTUTIL_H
