//===- CApiTests.cpp - The C API through libflashjit.so -------------------===//
//
/// \file
/// Drives libflashjit.so through tools/capi/flashjit.h only (no flashjit C++
/// symbol of the .so is visible); the inputs, the float64 reference and the
/// error measure come from the static flashjit_kernels library. CPU forward
/// and backward against the reference (masks, GQA, block-sparse, strided
/// tensors), the kernel cache, the backward's workspace size, chosen config,
/// emit. The errors and their messages: CApiErrorTests.cpp.
///
/// main() points the CUDA driver at a path that does not exist (unless
/// FLASHJIT_CAPI_TESTS_REAL_DRIVER is set), so that a CUDA handle fails with
/// FLASHJIT_ERROR_NO_DRIVER on every machine.
//
//===----------------------------------------------------------------------===//

#include "CApiTestUtil.h"
#include "flashjit.h"

#include "kernels/GpuDefaults.h"
#include "kernels/GpuGeometry.h"
#include "kernels/HostTensor.h"

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <gtest/gtest.h>
#include <random>
#include <string>

extern "C" int flashjit_c_smoke(char *why, size_t whyLen);

using namespace flashjit;
using namespace flashjit::capitest;

namespace {

struct Case {
  AttentionSpec spec;
  Problem problem;
  QKVLayout layout = QKVLayout::Separate;
  double density = -1;  ///< >= 0: block-sparse with this density
  bool strided = false; ///< O laid out as (B, N, H, d)
};

/// Runs \p c through the C API on the CPU and checks it against float64.
void runAndCheck(flashjit_handle *h, const Case &c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  AttentionData d = makeRandomInputs(c.spec, c.problem, c.layout, rng);
  const Problem &p = c.problem;
  if (c.strided) { // O as (B, N, H, dv): outer strides not packed
    int64_t dv = c.spec.headDimV;
    d.o.buffer = std::make_shared<std::vector<uint16_t>>(
        size_t(p.batch * p.seqLenQ * p.heads * dv),
        floatToHalf(c.spec.dtype, std::nanf("")));
    d.o.offset = 0;
    d.o.strides = {p.seqLenQ * p.heads * dv, dv, p.heads * dv, 1};
  }
  BlockSparseLayout layout;
  if (c.density >= 0)
    layout = BlockSparseLayout::random(
        p.batch, p.heads, ceilDiv(p.seqLenQ, c.spec.sparseBlock),
        ceilDiv(p.seqLenKV, c.spec.sparseBlock), c.density, seed);
  flashjit_spec spec = toC(c.spec);
  flashjit_tensor q = toC(d.q), k = toC(d.k), v = toC(d.v), o = toC(d.o);
  flashjit_layout cl = toC(layout);
  int64_t wl = -1, wr = -1;
  if (c.spec.mask == MaskKind::SlidingWindow) {
    wl = p.windowLeft >= kUnboundedWindow ? -1 : p.windowLeft;
    wr = p.windowRight >= kUnboundedWindow ? -1 : p.windowRight;
  }
  flashjit_status s =
      flashjit_forward(h, &spec, &q, &k, &v, &o, d.lse.data(), p.scale, wl, wr,
                       c.density >= 0 ? &cl : nullptr, nullptr);
  ASSERT_EQ(s, FLASHJIT_OK) << flashjit_last_error(h);
  ReferenceResult ref =
      referenceForward(c.spec, p, d, c.density >= 0 ? &layout : nullptr);
  ErrorReport e = compareWithReference(c.spec, p, d, ref);
  EXPECT_LE(e.relErr(), errorBound(c.spec.dtype))
      << c.spec.name() << ": o " << e.oRelErr << ", lse " << e.lseRelErr
      << ", NaN " << e.nanCount << ", lse -inf mismatches " << e.lseMismatch;
}

Case makeCase(int64_t dqk, int64_t dv, DType dtype, MaskKind mask, int64_t gqa,
              int64_t batch, int64_t heads, int64_t nq, int64_t nkv) {
  Case c;
  c.spec.headDimQK = dqk;
  c.spec.headDimV = dv;
  c.spec.dtype = dtype;
  c.spec.mask = mask;
  c.spec.gqaGroup = gqa;
  c.problem.batch = batch;
  c.problem.heads = heads;
  c.problem.seqLenQ = nq;
  c.problem.seqLenKV = nkv;
  return c;
}

} // namespace

//===----------------------------------------------------------------------===//
// Numbers
//===----------------------------------------------------------------------===//

TEST(CApi, CallableFromC) {
  char why[512] = "";
  EXPECT_EQ(flashjit_c_smoke(why, sizeof why), 0) << why;
}

TEST(CApi, ForwardMatchesReference) {
  Handle h;
  std::vector<Case> cases = {
      makeCase(64, 64, DType::BF16, MaskKind::None, 1, 2, 3, 100, 100),
      makeCase(96, 96, DType::FP16, MaskKind::Causal, 2, 1, 4, 77, 130),
      makeCase(40, 24, DType::BF16, MaskKind::SlidingWindow, 2, 1, 4, 130, 77),
      makeCase(7, 33, DType::FP16, MaskKind::Causal, 1, 2, 2, 129, 129),
  };
  cases[2].problem.windowLeft = 9;
  cases[2].problem.windowRight = 3;
  cases[3].problem.scale = 0.3;
  uint64_t seed = std::random_device{}();
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].spec.name() + " seed " + std::to_string(seed + i));
    runAndCheck(h, cases[i], seed + i);
  }
}

TEST(CApi, StridedTensors) {
  Handle h;
  // Q, K, V views of one (B, N, 3, H, d) buffer; O as (B, N, H, d).
  Case c = makeCase(64, 64, DType::BF16, MaskKind::Causal, 1, 2, 3, 90, 90);
  c.layout = QKVLayout::Packed;
  c.strided = true;
  runAndCheck(h, c, std::random_device{}());
}

TEST(CApi, BlockSparse) {
  Handle h;
  for (double density : {0.0, 0.4, 1.0}) {
    Case c = makeCase(32, 32, DType::FP16, MaskKind::None, 1, 2, 2, 200, 150);
    c.spec.blockSparse = true;
    c.spec.sparseBlock = 64;
    c.density = density;
    SCOPED_TRACE(density);
    runAndCheck(h, c, std::random_device{}());
  }
}

TEST(CApi, KernelsAreCached) {
  Handle h;
  Case c = makeCase(16, 16, DType::BF16, MaskKind::None, 1, 1, 1, 10, 10);
  EXPECT_EQ(flashjit_cached_kernels(h), 0);
  runAndCheck(h, c, 1);
  EXPECT_EQ(flashjit_cached_kernels(h), 1);
  c.problem.seqLenQ = 300; // another problem, same spec: same kernel
  c.problem.batch = 3;
  runAndCheck(h, c, 2);
  EXPECT_EQ(flashjit_cached_kernels(h), 1);
  c.spec.mask = MaskKind::Causal; // another spec
  runAndCheck(h, c, 3);
  EXPECT_EQ(flashjit_cached_kernels(h), 2);
}

TEST(CApi, LseMayBeNullOnCpu) {
  Handle h;
  SmallProblem sp;
  EXPECT_EQ(flashjit_forward(h, &sp.spec, &sp.q, &sp.k, &sp.v, &sp.o, nullptr,
                             0.0, -1, -1, nullptr, nullptr),
            FLASHJIT_OK)
      << lastError();
}

TEST(CApi, BackwardMatchesReferenceOnTheCpu) {
  Handle h;
  SmallProblem sp;
  ASSERT_EQ(sp.run(h), FLASHJIT_OK) << lastError();
  std::mt19937_64 rng(std::random_device{}());
  AttentionGrads g = makeRandomGrads(sp.specCpp, sp.p, sp.d, rng);
  // Both dQ modes (atomic first, the default); the deterministic one last.
  for (int32_t deterministic : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << "deterministic " << deterministic);
    sp.spec.deterministic = deterministic;
    ASSERT_EQ(sp.backward(h, g), FLASHJIT_OK) << lastError();
    expectGradsMatch(sp, g);
  }
  int64_t kernels = flashjit_cached_kernels(h);
  EXPECT_EQ(kernels, 3); // the forward's and the backward's of each mode

  // Deterministic, with a caller's workspace of exactly the size asked for
  // (a CPU handle does not touch it): the same gradients, bit for bit, and
  // no new kernel.
  AttentionGrads again = g;
  for (HalfTensor *t : {&again.dq, &again.dk, &again.dv})
    t->buffer = std::make_shared<std::vector<uint16_t>>(
        t->buffer->size(), floatToHalf(sp.specCpp.dtype, std::nanf("")));
  std::vector<std::max_align_t> workspace(
      sp.workspaceBytes(h) / sizeof(std::max_align_t) + 1);
  ASSERT_EQ(
      sp.backward(h, again, nullptr, workspace.data(), sp.workspaceBytes(h)),
      FLASHJIT_OK)
      << lastError();
  EXPECT_EQ(*again.dq.buffer, *g.dq.buffer);
  EXPECT_EQ(*again.dk.buffer, *g.dk.buffer);
  EXPECT_EQ(*again.dv.buffer, *g.dv.buffer);
  EXPECT_EQ(flashjit_cached_kernels(h), kernels);
}

namespace {

/// y = s - 0.0625 (h + 1) |i - j| for j <= i, else s / 2: a score
/// modifier that is no named variant, by hand in float64 (the reference's
/// side: independent of the compiler's evaluation and derivative).
class RelativeBias : public ScoreFunction {
public:
  double apply(double s, int64_t, int64_t h, int64_t i, int64_t j,
               const Captures *, double *dScore) const override {
    if (j <= i) {
      *dScore = 1;
      return s - 0.0625 * double(h + 1) * double(i - j);
    }
    *dScore = 0.5;
    return s * 0.5;
  }
};

/// RelativeBias as a score_mod region's text (\p names: the spelling of
/// its SSA values, which must not matter).
std::string relativeBiasRegion(const std::string &names) {
  std::string t = R"({
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %NAMEle = arith.cmpi sle, %j, %i : index
    %NAMEd = arith.subi %i, %j : index
    %NAMEone = arith.constant 1 : index
    %NAMEh1 = arith.addi %h, %NAMEone : index
    %NAMEw = arith.muli %NAMEh1, %NAMEd : index
    %NAMEwi = arith.index_cast %NAMEw : index to i32
    %NAMEwf = arith.sitofp %NAMEwi : i32 to f32
    %NAMEk = arith.constant 0.0625 : f32
    %NAMEbias = arith.mulf %NAMEwf, %NAMEk : f32
    %NAMEa = arith.subf %s, %NAMEbias : f32
    %NAMEhalf = arith.constant 0.5 : f32
    %NAMEb = arith.mulf %s, %NAMEhalf : f32
    %NAMEy = arith.select %NAMEle, %NAMEa, %NAMEb : f32
    attn.yield %NAMEy : f32
  })";
  for (size_t at; (at = t.find("NAME")) != std::string::npos;)
    t.replace(at, 4, names);
  return t;
}

/// sp's forward and backward on the CPU (its spec's score_mod set)
/// against the float64 reference of sp.specCpp's modifier; the plain
/// reference must fail the forward (the check sees the modifier).
void expectModifiedAttentionMatches(flashjit_handle *h, SmallProblem &sp) {
  ASSERT_EQ(sp.run(h), FLASHJIT_OK) << lastError();
  ReferenceResult ref = referenceForward(sp.specCpp, sp.p, sp.d, nullptr);
  EXPECT_LT(compareWithReference(sp.specCpp, sp.p, sp.d, ref).relErr(),
            errorBound(sp.specCpp.dtype));
  AttentionSpec plain = sp.specCpp;
  plain.scoreMod.clear();
  plain.scoreFunction.reset();
  ReferenceResult off = referenceForward(plain, sp.p, sp.d, nullptr);
  EXPECT_GT(compareWithReference(sp.specCpp, sp.p, sp.d, off).relErr(),
            errorBound(sp.specCpp.dtype));
  std::mt19937_64 rng(std::random_device{}());
  AttentionGrads g = makeRandomGrads(sp.specCpp, sp.p, sp.d, rng);
  ASSERT_EQ(sp.backward(h, g), FLASHJIT_OK) << lastError();
  expectGradsMatch(sp, g);
}

} // namespace

/// Named score modifiers (spec.score_mod, version 5): the forward and the
/// gradients against float64 for softcap and ALiBi; a name and its
/// canonical spelling are one kernel; a bad name, or "custom" (a region
/// has no name), is a named error.
TEST(CApi, ScoreModifiersOnTheCpu) {
  for (const char *mod : {"softcap:0.5", "alibi:4"}) {
    SCOPED_TRACE(mod);
    Handle h;
    SmallProblem sp;
    sp.specCpp.scoreMod = mod;
    sp.spec.score_mod = mod;
    expectModifiedAttentionMatches(h, sp);
  }
  Handle h;
  SmallProblem sp;
  sp.spec.score_mod = "softcap:2";
  ASSERT_EQ(sp.run(h), FLASHJIT_OK) << lastError();
  const int64_t kernels = flashjit_cached_kernels(h);
  sp.spec.score_mod = "softcap:2.0";
  ASSERT_EQ(sp.run(h), FLASHJIT_OK) << lastError();
  EXPECT_EQ(flashjit_cached_kernels(h), kernels);
  for (const char *bad : {"softcap:-1", "alibi:3", "custom", "relpos:2"}) {
    sp.spec.score_mod = bad;
    EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT) << bad;
    EXPECT_NE(std::string(flashjit_last_error(h)).find("score"),
              std::string::npos)
        << bad << ": " << flashjit_last_error(h);
  }
  std::string tooLong(300, 'x');
  sp.spec.score_mod = tooLong.c_str();
  EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT);
}

/// Score modifiers as region text (spec.score_mod starting with "{",
/// version 6): the forward and the gradients against float64 with the
/// modifier written by hand; two spellings of one region are one kernel;
/// softcap's region is softcap's kernel; a region that does not parse or
/// verify, or text that closes the region and goes on, is a named error.
TEST(CApi, ScoreModRegionsOnTheCpu) {
  Handle h;
  SmallProblem sp;
  const std::string region = relativeBiasRegion("x");
  sp.spec.score_mod = region.c_str();
  sp.specCpp.scoreMod = kCustomScoreMod;
  sp.specCpp.scoreFunction = std::make_shared<RelativeBias>();
  expectModifiedAttentionMatches(h, sp);

  const int64_t kernels = flashjit_cached_kernels(h);
  const std::string respelled = relativeBiasRegion("other_");
  sp.spec.score_mod = respelled.c_str();
  ASSERT_EQ(sp.run(h), FLASHJIT_OK) << lastError();
  EXPECT_EQ(flashjit_cached_kernels(h), kernels);
  const std::string softcap = R"({
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c = arith.constant 8.0 : f32
    %x = arith.divf %s, %c : f32
    %t = math.tanh %x : f32
    %y = arith.mulf %c, %t : f32
    attn.yield %y : f32
  })";
  sp.spec.score_mod = softcap.c_str();
  ASSERT_EQ(sp.run(h), FLASHJIT_OK) << lastError();
  const int64_t withSoftcap = flashjit_cached_kernels(h);
  EXPECT_EQ(withSoftcap, kernels + 1);
  sp.spec.score_mod = "softcap:8";
  ASSERT_EQ(sp.run(h), FLASHJIT_OK) << lastError();
  EXPECT_EQ(flashjit_cached_kernels(h), withSoftcap);

  const std::string bad[] = {
      "{ ^bb0(%s: f32): attn.yield %s : f32 }",
      "{ ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):\n"
      "  %t = tensor.empty() : tensor<2xf32>\n  attn.yield %s : f32 }",
      "{ ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):\n"
      "  attn.yield %s : f32 } } module {",
      "{ not ir"};
  for (const std::string &text : bad) {
    sp.spec.score_mod = text.c_str();
    EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT) << text;
    EXPECT_NE(std::string(flashjit_last_error(h)).find("score_mod region"),
              std::string::npos)
        << text << ": " << flashjit_last_error(h);
  }
  std::string huge = "{" + std::string(70000, ' ') + "}";
  sp.spec.score_mod = huge.c_str();
  EXPECT_EQ(sp.run(h), FLASHJIT_ERROR_INVALID_ARGUMENT);
}

TEST(CApi, BackwardWorkspaceSize) {
  Handle h;
  SmallProblem sp; // B 2, H 4, Nq 20, Nkv 33, head_dim_qk 32
  // Dense, atomic dQ (the default): delta and -lse * log2(e), fp32
  // [2, B, H, Nq], then dq_accum, fp32 [B, H, Nq, 32].
  const size_t stats = 2 * 2 * 4 * 20 * 4, accum = 2 * 4 * 20 * 32 * 4;
  ASSERT_EQ(sp.spec.deterministic, 0);
  EXPECT_EQ(sp.workspaceBytes(h), stats + accum);
  // An odd B * H * Nq (one head, no GQA, 7 rows): the statistics end at
  // 56 bytes, dq_accum starts at the next 16-byte boundary, 64.
  sp.spec.gqa = 1;
  size_t odd = 0;
  EXPECT_EQ(flashjit_backward_workspace_size(h, &sp.spec, 1, 1, 7, 33, &odd),
            FLASHJIT_OK)
      << lastError();
  EXPECT_EQ(odd, size_t(64 + 7 * 32 * 4));
  sp.spec.gqa = 2;
  // Deterministic: the statistics only, whatever the spec's direction.
  sp.spec.deterministic = 1;
  EXPECT_EQ(sp.workspaceBytes(h), stats);
  sp.spec.direction = FLASHJIT_DIRECTION_BACKWARD;
  EXPECT_EQ(sp.workspaceBytes(h), stats);
  sp.spec.deterministic = 2;
  size_t bad = 1;
  EXPECT_EQ(flashjit_backward_workspace_size(h, &sp.spec, 2, 4, 20, 33, &bad),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("spec.deterministic must be 0"), std::string::npos)
      << lastError();
  sp.spec.deterministic = 1;
  // Block-sparse by 16: 2 Q blocks, 3 KV blocks; the transpose's counts
  // [B, H, 3] (96 bytes at 1280, after the statistics' 1280) and indices
  // [B, H, 3, 2] (192 bytes at 1536) follow, each 256-byte aligned.
  sp.spec.block_sparse = 1;
  sp.spec.sparse_block = 16;
  EXPECT_EQ(sp.workspaceBytes(h), size_t(1536 + 2 * 4 * 3 * 2 * 4));
  // Atomic: the transpose after dq_accum (counts at 1280 + 20480 = 21760,
  // indices at 22016).
  sp.spec.deterministic = 0;
  EXPECT_EQ(sp.workspaceBytes(h), size_t(22016 + 2 * 4 * 3 * 2 * 4));

  size_t bytes = 1;
  EXPECT_EQ(flashjit_backward_workspace_size(h, &sp.spec, 0, 4, 20, 33, &bytes),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("batch"), std::string::npos) << lastError();
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(
      flashjit_backward_workspace_size(h, &sp.spec, 2, 4, 20, 33, nullptr),
      FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("bytes is NULL"), std::string::npos)
      << lastError();
  EXPECT_EQ(
      flashjit_backward_workspace_size(nullptr, &sp.spec, 2, 4, 20, 33, &bytes),
      FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flashjit_backward_workspace_size(h, nullptr, 2, 4, 20, 33, &bytes),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  // The largest sizes the problem accepts overflow 64 bits: a named error.
  EXPECT_EQ(flashjit_backward_workspace_size(h, &sp.spec, int64_t(1) << 20,
                                             int64_t(1) << 20, int64_t(1) << 24,
                                             33, &bytes),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("exceed 2^63 bytes"), std::string::npos)
      << lastError();
  // Delta fits, the layout's transpose does not ([B, H, 2^20, 2^20] int32).
  EXPECT_EQ(flashjit_backward_workspace_size(h, &sp.spec, int64_t(1) << 20, 16,
                                             int64_t(1) << 24, int64_t(1) << 24,
                                             &bytes),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("exceed 2^63 bytes"), std::string::npos)
      << lastError();
}
//===----------------------------------------------------------------------===//
// Inspecting
//===----------------------------------------------------------------------===//

TEST(CApi, ChosenConfigIsTheDefaultTiling) {
  Handle h;
  AttentionSpec s;
  s.headDimQK = s.headDimV = 96;
  s.mask = MaskKind::Causal;
  flashjit_spec spec = toC(s);
  int64_t out[4] = {};
  ASSERT_EQ(flashjit_chosen_config(h, &spec, 2, 8, 1000, 1000, out),
            FLASHJIT_OK)
      << lastError();
  TileConfig want = defaultGpuConfig(s);
  EXPECT_EQ(out[0], want.blockM);
  EXPECT_EQ(out[1], want.blockN);
  EXPECT_EQ(out[2], want.warps);
  EXPECT_EQ(out[3], want.stages);
  EXPECT_EQ(flashjit_chosen_config(h, &spec, 0, 8, 1000, 1000, out),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("batch"), std::string::npos) << lastError();

  // The backward's tiling, through the spec's direction.
  spec.direction = FLASHJIT_DIRECTION_BACKWARD;
  ASSERT_EQ(flashjit_chosen_config(h, &spec, 2, 8, 1000, 1000, out),
            FLASHJIT_OK)
      << lastError();
  s.direction = Direction::Backward;
  TileConfig bwd = defaultGpuBackwardConfig(s);
  EXPECT_EQ(out[0], bwd.blockM);
  EXPECT_EQ(out[1], bwd.blockN);
  EXPECT_EQ(out[2], bwd.warps);
  spec.direction = 2;
  EXPECT_EQ(flashjit_chosen_config(h, &spec, 2, 8, 1000, 1000, out),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastError().find("spec.direction"), std::string::npos)
      << lastError();
}

TEST(CApi, EmitStages) {
  Handle h;
  flashjit_spec spec;
  flashjit_spec_init(&spec);
  spec.head_dim_qk = spec.head_dim_v = 64;
  spec.mask = FLASHJIT_MASK_CAUSAL;
  char *out = nullptr;
  size_t len = 0;
  ASSERT_EQ(flashjit_emit(h, &spec, "attn", nullptr, &out, &len), FLASHJIT_OK)
      << lastError();
  std::string attn(out, len);
  flashjit_free(out);
  EXPECT_NE(attn.find("attn.flash_fwd"), std::string::npos) << attn;
  EXPECT_EQ(attn.size(), std::strlen(attn.c_str()));

  ASSERT_EQ(flashjit_emit(h, &spec, "tiled", nullptr, &out, &len), FLASHJIT_OK)
      << lastError();
  std::string tiled(out, len);
  flashjit_free(out);
  EXPECT_NE(tiled.find("scf.for"), std::string::npos);

  ASSERT_EQ(flashjit_emit(h, &spec, "ptx", "sm_80", &out, &len), FLASHJIT_OK)
      << lastError();
  std::string ptx(out, len);
  flashjit_free(out);
  EXPECT_NE(ptx.find(".target sm_80"), std::string::npos);
  EXPECT_NE(ptx.find(".entry attention"), std::string::npos);

  EXPECT_EQ(flashjit_emit(h, &spec, "bogus", nullptr, &out, &len),
            FLASHJIT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_NE(lastError().find("bogus"), std::string::npos) << lastError();

  // The backward's stages: attn.flash_bwd and three kernels; its tiled
  // @attention_dq converts the atomic accumulator, or is the separate pass.
  spec.direction = FLASHJIT_DIRECTION_BACKWARD;
  ASSERT_EQ(flashjit_emit(h, &spec, "attn", nullptr, &out, &len), FLASHJIT_OK)
      << lastError();
  std::string bwdAttn(out, len);
  flashjit_free(out);
  EXPECT_NE(bwdAttn.find("attn.flash_bwd"), std::string::npos) << bwdAttn;
  EXPECT_EQ(bwdAttn.find("deterministic"), std::string::npos) << bwdAttn;
  ASSERT_EQ(flashjit_emit(h, &spec, "tiled", nullptr, &out, &len), FLASHJIT_OK)
      << lastError();
  std::string bwdTiled(out, len);
  flashjit_free(out);
  EXPECT_NE(bwdTiled.find("role = \"dq_convert\""), std::string::npos);
  // The GPU lowering takes the deterministic form.
  spec.deterministic = 1;
  ASSERT_EQ(flashjit_emit(h, &spec, "attn", nullptr, &out, &len), FLASHJIT_OK)
      << lastError();
  bwdAttn.assign(out, len);
  flashjit_free(out);
  EXPECT_NE(bwdAttn.find("deterministic = true"), std::string::npos) << bwdAttn;
  ASSERT_EQ(flashjit_emit(h, &spec, "ptx", "sm_80", &out, &len), FLASHJIT_OK)
      << lastError();
  std::string bwdPtx(out, len);
  flashjit_free(out);
  for (const char *entry : {".entry attention_preprocess(", ".entry attention(",
                            ".entry attention_dq("})
    EXPECT_NE(bwdPtx.find(entry), std::string::npos) << entry;
}

TEST(CApi, VersionAndStatusNames) {
  EXPECT_STRNE(flashjit_version(), "");
  EXPECT_STREQ(flashjit_status_name(FLASHJIT_OK), "OK");
  EXPECT_STREQ(flashjit_status_name(FLASHJIT_ERROR_NO_DRIVER), "NO_DRIVER");
  EXPECT_STREQ(flashjit_status_name(FLASHJIT_ERROR_NOT_IMPLEMENTED),
               "NOT_IMPLEMENTED");
}

int main(int argc, char **argv) {
  // The CUDA driver is loaded on first use; make that fail everywhere, so
  // that the no-driver path is tested on GPU machines too.
  if (!std::getenv("FLASHJIT_CAPI_TESTS_REAL_DRIVER"))
    setenv("FLASHJIT_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
