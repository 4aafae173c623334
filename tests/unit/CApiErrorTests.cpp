//===- CApiErrorTests.cpp - The C API's errors and their messages ---------===//
//
/// \file
/// The errors of libflashjit.so's forward and backward, through
/// tools/capi/flashjit.h only (as CApiTests.cpp, whose main() this binary
/// runs): bad fields, shapes, strides, enums, windows and layouts, NULL
/// arguments, a CUDA handle without a driver, the backward's gradients, lse
/// and workspace, sizes that overflow; each a named status with a message
/// that names what is wrong.
//
//===----------------------------------------------------------------------===//

#include "CApiTestUtil.h"
#include "flashjit.h"

#include "kernels/HostTensor.h"

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <random>
#include <string>
#include <vector>

using namespace flashjit;
using namespace flashjit::capitest;

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

TEST(CApiErrors, BadHeadDimNamesTheField) {
  Handle h;
  SmallProblem sp;
  sp.spec.head_dim_qk = 0;
  EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("head_dim_qk"), std::string::npos) << lastError();
  sp.spec.head_dim_qk = 32;
  sp.spec.head_dim_v = 513;
  EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("head_dim_v"), std::string::npos) << lastError();
  EXPECT_NE(lastError().find("513"), std::string::npos) << lastError();
}

TEST(CApiErrors, InnermostStrideMustBeOne) {
  Handle h;
  SmallProblem sp;
  sp.k.strides[3] = 2;
  EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("k.strides[3]"), std::string::npos) << lastError();
}

TEST(CApiErrors, MismatchedShapes) {
  Handle h;
  {
    SmallProblem sp;
    sp.v.shape[2] = 32; // Nkv of v differs from k's
    EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(lastError().find("v.shape[2]"), std::string::npos) << lastError();
  }
  {
    SmallProblem sp;
    sp.q.shape[3] = 16; // not the spec's head dim
    EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(lastError().find("q.shape[3]"), std::string::npos) << lastError();
  }
  {
    SmallProblem sp;
    sp.spec.gqa = 1; // q has 4 heads, k has 2
    EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(lastError().find("gqa"), std::string::npos) << lastError();
  }
  {
    SmallProblem sp;
    sp.o.shape[0] = 1;
    EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(lastError().find("o.shape[0]"), std::string::npos) << lastError();
  }
  {
    SmallProblem sp;
    sp.q.data = nullptr;
    EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(lastError().find("q.data"), std::string::npos) << lastError();
  }
}

TEST(CApiErrors, BadEnumsAndWindows) {
  Handle h;
  {
    SmallProblem sp;
    sp.spec.dtype = 7;
    EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(lastError().find("dtype"), std::string::npos) << lastError();
  }
  {
    SmallProblem sp; // a window without the sliding-window mask
    EXPECT_EQ(sp.run(h, nullptr, 4, 0), FLASHJIT_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(lastError().find("window"), std::string::npos) << lastError();
  }
  {
    SmallProblem sp;
    sp.spec.mask = FLASHJIT_MASK_SLIDING_WINDOW;
    EXPECT_EQ(sp.run(h, nullptr, -5, 0), FLASHJIT_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(lastError().find("window_left"), std::string::npos)
        << lastError();
    EXPECT_EQ(sp.run(h, nullptr, 3, -1), FLASHJIT_OK) << lastError();
  }
}

TEST(CApiErrors, Layouts) {
  Handle h;
  SmallProblem sp;
  sp.spec.block_sparse = 1;
  sp.spec.sparse_block = 16;
  EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("layout"), std::string::npos) << lastError();
  BlockSparseLayout l = BlockSparseLayout::random(1, 1, 2, 3, 0.5, 1);
  flashjit_layout cl = toC(l);
  EXPECT_EQ(sp.run(h, &cl), FLASHJIT_OK) << lastError();
  cl.kv_blocks = 2;
  EXPECT_EQ(sp.run(h, &cl), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("blocks"), std::string::npos) << lastError();
  l.indices[0] = 9; // out of range: checked on the CPU
  l.counts[0] = 1;
  cl = toC(l);
  EXPECT_EQ(sp.run(h, &cl), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("out of range"), std::string::npos) << lastError();
  sp.spec.block_sparse = 0;
  EXPECT_EQ(sp.run(h, &cl), FLASHJIT_ERROR_INVALID_ARGUMENT);
}

TEST(CApiErrors, NullArguments) {
  SmallProblem sp;
  EXPECT_EQ(sp.run(nullptr), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("handle"), std::string::npos) << lastError();
  EXPECT_EQ(flashjit_create(nullptr, FLASHJIT_DEVICE_CPU),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  flashjit_handle *h = nullptr;
  EXPECT_EQ(flashjit_create(&h, 5), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(h, nullptr);
  flashjit_destroy(nullptr); // fine
  flashjit_free(nullptr);
}

TEST(CApiErrors, CudaHandleWithoutDriver) {
  if (std::getenv("FLASHJIT_CAPI_TESTS_REAL_DRIVER"))
    GTEST_SKIP() << "the real driver is in use";
  flashjit_handle *h = nullptr;
  EXPECT_EQ(flashjit_create(&h, FLASHJIT_DEVICE_CUDA),
            FLASHJIT_ERROR_NO_DRIVER);
  EXPECT_EQ(h, nullptr);
  EXPECT_NE(lastError().find("no CUDA driver"), std::string::npos)
      << lastError();
}
TEST(CApiErrors, BackwardRejectsBadGradientsAndMissingLse) {
  Handle h;
  SmallProblem sp;
  ASSERT_EQ(sp.run(h), FLASHJIT_OK) << lastError();
  // dq shaped as k, not q.
  EXPECT_EQ(flashjit_backward(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o, &sp.o,
                              sp.d.lse.data(), &sp.k, &sp.k, &sp.v, 0.0, -1, -1,
                              nullptr, nullptr, 0, nullptr),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("dq must be shaped as q"), std::string::npos)
      << lastError();
  EXPECT_EQ(flashjit_backward(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o, &sp.o,
                              nullptr, &sp.q, &sp.k, &sp.v, 0.0, -1, -1,
                              nullptr, nullptr, 0, nullptr),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("lse is NULL"), std::string::npos) << lastError();
}

/// The workspace arguments are checked the same way on every device.
TEST(CApiErrors, BackwardChecksTheWorkspace) {
  Handle h;
  SmallProblem sp;
  ASSERT_EQ(sp.run(h), FLASHJIT_OK) << lastError();
  std::mt19937_64 rng(3);
  AttentionGrads g = makeRandomGrads(sp.specCpp, sp.p, sp.d, rng);
  size_t need = sp.workspaceBytes(h);
  std::vector<std::max_align_t> buffer(need / sizeof(std::max_align_t) + 2);
  char *workspace = reinterpret_cast<char *>(buffer.data());

  EXPECT_EQ(sp.backward(h, g, nullptr, nullptr, need),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("workspace is NULL but workspace_bytes is"),
            std::string::npos)
      << lastError();
  EXPECT_EQ(sp.backward(h, g, nullptr, workspace, need - 1),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find(fmt::format("is less than the {} bytes", need)),
            std::string::npos)
      << lastError();
  EXPECT_EQ(sp.backward(h, g, nullptr, workspace + 4, need),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("16-byte aligned"), std::string::npos)
      << lastError();
  EXPECT_EQ(sp.backward(h, g, nullptr, workspace, need + 16), FLASHJIT_OK)
      << lastError();
}
TEST(CApiErrors, BackwardRefusesALayoutThatListsABlockTwice) {
  Handle h;
  SmallProblem sp;
  sp.spec.block_sparse = 1;
  sp.spec.sparse_block = 16;
  sp.specCpp.blockSparse = true;
  sp.specCpp.sparseBlock = 16;
  BlockSparseLayout l = twoByThreeLayout();
  flashjit_layout cl = toC(l);
  ASSERT_EQ(sp.run(h, &cl), FLASHJIT_OK) << lastError();
  l.indices[1] = l.indices[0]; // Q block 0 lists KV block 0 twice
  cl = toC(l);
  std::mt19937_64 rng(5);
  AttentionGrads g = makeRandomGrads(sp.specCpp, sp.p, sp.d, rng);
  EXPECT_EQ(sp.backward(h, g, &cl), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("listed twice"), std::string::npos) << lastError();
}

/// Issue 16: the total size is checked before anything is copied. A shape
/// whose B * H * N * d wraps past 2^64 segfaulted; zero strides keep every
/// view's reach small, so only the total is wrong.
TEST(CApiErrors, ForwardChecksTheTotalSizeBeforeAnyCopy) {
  Handle h;
  AttentionSpec s;
  s.headDimQK = s.headDimV = 16;
  flashjit_spec spec = toC(s);
  uint16_t dummy[16] = {};
  float lse[1];
  flashjit_tensor t = {
      dummy,
      {int64_t(1) << 20, int64_t(1) << 20, int64_t(1) << 24, 16},
      {0, 0, 0, 1}};
  EXPECT_EQ(flashjit_forward(h, &spec, &t, &t, &t, &t, lse, 0.0, -1, -1,
                             nullptr, nullptr),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("flashjit_forward: problem too large: q would "
                             "hold batch * heads * seq_len * head_dim_qk = "
                             "1048576 * 1048576 * 16777216 * 16 elements "
                             "(overflows int64)"),
            std::string::npos)
      << lastError();
  // The backward runs the same check.
  flashjit_status st =
      flashjit_backward(h, &spec, &t, &t, &t, &t, &t, lse, &t, &t, &t, 0.0, -1,
                        -1, nullptr, nullptr, 0, nullptr);
  EXPECT_EQ(st, FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("problem too large"), std::string::npos)
      << lastError();
}

TEST(CApiErrors, AStrideOf2To62IsRefused) {
  Handle h;
  SmallProblem sp;
  sp.k.strides[0] = int64_t(1) << 62;
  EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("k: shape [2, 2, 33, 32] with strides "
                             "[4611686018427387904, 1056, 32, 1] reaches past "
                             "element 2^47"),
            std::string::npos)
      << lastError();
  SmallProblem ok;
  EXPECT_EQ(ok.run(h), FLASHJIT_OK) << lastError();
}

TEST(CApiErrors, AVarlenFieldOtherThanZeroOrOneIsRefused) {
  Handle h;
  SmallProblem sp;
  sp.spec.varlen = 7;
  EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("spec.varlen must be 0 (B, H, N, d tensors) or "
                             "1 (variable-length packing), got 7"),
            std::string::npos)
      << lastError();
  int64_t out[4];
  EXPECT_EQ(flashjit_chosen_config(h, &sp.spec, 1, 2, 16, 16, out),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("spec.varlen"), std::string::npos) << lastError();
  // A varlen spec needs the varlen call.
  sp.spec.varlen = 1;
  EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("flashjit_forward_varlen"), std::string::npos)
      << lastError();
}

TEST(CApiErrors, AScaleThatOverflowsF32IsRefused) {
  Handle h;
  SmallProblem sp;
  for (double scale : {1e38, 1e-320}) {
    flashjit_status st =
        flashjit_forward(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o,
                         sp.d.lse.data(), scale, -1, -1, nullptr, nullptr);
    EXPECT_EQ(st, FLASHJIT_ERROR_INVALID_ARGUMENT) << scale;
    EXPECT_NE(lastError().find("scale must be 0 (1/sqrt(head_dim)) or in "
                               "[2^-126, 2^63]"),
              std::string::npos)
        << lastError();
  }
}

TEST(CApiErrors, ForwardRefusesALayoutThatListsABlockTwice) {
  Handle h;
  SmallProblem sp;
  sp.spec.block_sparse = 1;
  sp.spec.sparse_block = 16;
  BlockSparseLayout l = twoByThreeLayout();
  l.indices[1] = l.indices[0]; // Q block 0 lists KV block 0 twice
  flashjit_layout cl = toC(l);
  EXPECT_EQ(sp.run(h, &cl), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("layout: KV block 0 is listed twice for batch 0, "
                             "head 0, Q block 0"),
            std::string::npos)
      << lastError();
}

/// A NaN lse would read as a row that sees no key (a zero dQ row): refused.
TEST(CApiErrors, BackwardRefusesANanLse) {
  Handle h;
  SmallProblem sp;
  ASSERT_EQ(sp.run(h), FLASHJIT_OK) << lastError();
  std::mt19937_64 rng(3);
  AttentionGrads g = makeRandomGrads(sp.specCpp, sp.p, sp.d, rng);
  ASSERT_EQ(sp.backward(h, g), FLASHJIT_OK) << lastError();
  // Row (batch 1, head 2, query 5).
  sp.d.lse[size_t((1 * 4 + 2) * 20 + 5)] = std::nanf("");
  EXPECT_EQ(sp.backward(h, g), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("lse[1, 2, 5] is nan: the forward's lse is "
                             "finite, or -inf for a row that sees no key"),
            std::string::npos)
      << lastError();
  sp.d.lse[size_t((1 * 4 + 2) * 20 + 5)] = INFINITY;
  EXPECT_EQ(sp.backward(h, g), FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("lse[1, 2, 5] is inf"), std::string::npos)
      << lastError();
}
