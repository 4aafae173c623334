//===- GpuAffineConversionTests.cpp - Index tiles to f32, in the PTX ------===//
//
/// \file
/// arith.sitofp of an index tile affine in the element's row and column
/// (kv_idx - q_idx in the KV loop) is lowered as one conversion per column
/// parity and adds of constants (TileKernelLowering::lowerAffineConversion);
/// any other i32 tile keeps one conversion per register; ALiBi's bias on the
/// overlapped loop is a product step instead (BiasProduct.h). Checked on the
/// PTX, no GPU needed.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "tests/unit/AttentionCases.h"

#include <gtest/gtest.h>

#include <string>

using namespace flashjit;
using flashjit::test::occurrences;
using flashjit::test::tileConfig;

namespace {

/// The attn stage of a forward of head dim \p d and \p mask whose
/// score_mod adds \p body's %bias (an f32 from the index values %i and %j)
/// to the score.
std::string withBias(const char *body, int d = 64, const char *mask = "none") {
  const std::string dim = std::to_string(d) + " : i64";
  return "module {\n  attn.flash_fwd @attention {element_type = bf16, gqa = "
         "1 : i64, head_dim_qk = " +
         dim + ", head_dim_v = " + dim + ", mask = \"" + mask +
         "\"} score_mod {\n  ^bb0(%s: f32, %b: index, %h: index, %i: "
         "index, %j: index):\n" +
         body + "    %y = arith.addf %s, %bias : f32\n" +
         "    attn.yield %y : f32\n  }\n}\n";
}

} // namespace

/// A distance bias -|j - i| / 4 at d = 128 on the ring (plain and
/// overlapped loop, plain and causal) and on mma.sync (sm_80, two 16-row
/// tiles a warp): its |.| keeps the conversion of kv_idx - q_idx in the KV
/// loop (ALiBi's bias leaves the loop, peelUniformAddend), at most two
/// conversions a site (the loop; the overlapped loop's first block), the
/// other registers an add.rn.f32 of a multiple of 8 (8.0 is 0f41000000);
/// without the pattern, 34 a site at d = 128 on the ring.
TEST(GpuAffineConversion, DistanceBiasConvertsTwoRegistersASite) {
  const char *distance = R"(
    %d = arith.subi %j, %i : index
    %di = arith.index_cast %d : index to i32
    %df = arith.sitofp %di : i32 to f32
    %a = math.absf %df : f32
    %c = arith.constant -0.25 : f32
    %bias = arith.mulf %a, %c : f32
)";
  for (bool overlap : {false, true})
    for (const char *mask : {"none", "causal"}) {
      KernelSource source{withBias(distance, 128, mask), "distance.mlir"};
      TileConfig config = tileConfig(128, 128, 8);
      config.overlapSoftmax = overlap;
      GpuTarget target;
      SCOPED_TRACE(std::string(mask) + " " + config.toJson());
      std::string ptx =
          compileToPtx(inspectSource(source).spec, config, target, source);
      const int sites = overlap ? 2 : 1;
      EXPECT_EQ(occurrences(ptx, "cvt.rn.f32.s32"), 2 * sites);
      EXPECT_NE(ptx.find("add.rn.f32"), std::string::npos);
      EXPECT_NE(ptx.find("0f41000000;"), std::string::npos);
    }
  KernelSource source{withBias(distance, 64, "none"), "distance.mlir"};
  GpuTarget ampere;
  ampere.arch = "sm_80";
  // Two in the loop, one of a thread's column index before it.
  EXPECT_LE(occurrences(compileToPtx(inspectSource(source).spec,
                                     tileConfig(128, 64, 4), ampere, source),
                        "cvt.rn.f32.s32"),
            3);
}

/// A product of the indices is not affine: one conversion per distinct
/// register value, as before (more than two a site).
TEST(GpuAffineConversion, OtherIndexTilesConvertEachRegister) {
  GpuTarget target;
  const char *product = R"(
    %p = arith.muli %i, %j : index
    %pi = arith.index_cast %p : index to i32
    %pf = arith.sitofp %pi : i32 to f32
    %c = arith.constant 1.0e-6 : f32
    %bias = arith.mulf %pf, %c : f32
)";
  const TileConfig config = tileConfig(64, 128, 4);
  auto ptxOf = [&](const char *body, const char *name) {
    KernelSource source{withBias(body), name};
    return compileToPtx(inspectSource(source).spec, config, target, source);
  };
  EXPECT_GT(occurrences(ptxOf(product, "product.mlir"), "cvt.rn.f32.s32"), 8);
}

/// ALiBi's bias (slope (j - i), the slope a function of the head) on the
/// ring's overlapped loop at d = 128 is one more wgmma on Q K^T's
/// accumulator (BiasProduct.h): two more MMAs than the same loop's plain
/// kernel (the first block's and the loop's), each issued in Q K^T's batch
/// (as many commit groups as the plain kernel), A from registers; its
/// 16 x 128 operand written once by 2-byte shared stores before a proxy
/// fence, in a slot of its own past the plain kernel's shared memory.
TEST(GpuAffineConversion, AlibiIsOneMoreWarpgroupMma) {
  const char *alibi = R"(
    %one = arith.constant 1 : index
    %h1 = arith.addi %h, %one : index
    %hi = arith.index_cast %h1 : index to i32
    %hf = arith.sitofp %hi : i32 to f32
    %e = arith.constant -0.5 : f32
    %x = arith.mulf %hf, %e : f32
    %slope = math.exp2 %x : f32
    %d = arith.subi %j, %i : index
    %di = arith.index_cast %d : index to i32
    %df = arith.sitofp %di : i32 to f32
    %bias = arith.mulf %slope, %df : f32
)";
  KernelSource source{withBias(alibi, 128), "alibi.mlir"};
  KernelSource plainSource{
      withBias("    %bias = arith.constant 0.0 : f32\n", 128), "plain.mlir"};
  TileConfig config = tileConfig(128, 128, 8);
  config.overlapSoftmax = true;
  GpuTarget target;
  target.arch = "sm_90a";
  const std::string ptx =
      compileToPtx(inspectSource(source).spec, config, target, source);
  const std::string plain = compileToPtx(inspectSource(plainSource).spec,
                                         config, target, plainSource);
  EXPECT_EQ(occurrences(ptx, "wgmma.mma_async"),
            occurrences(plain, "wgmma.mma_async") + 2);
  EXPECT_EQ(occurrences(ptx, "wgmma.commit_group"),
            occurrences(plain, "wgmma.commit_group"));
  EXPECT_EQ(occurrences(ptx, "st.shared.b16"), 6) << "2048 elements, 384 "
                                                     "threads";
  EXPECT_EQ(occurrences(plain, "st.shared.b16"), 0);
  const size_t fill = ptx.find("st.shared.b16"),
               fence = ptx.find("fence.proxy.async", fill),
               first = ptx.find("wgmma.mma_async");
  EXPECT_LT(fence, first);
}
