//===- BackwardRingMapTests.cpp - The backward ring's tensor maps, on the CPU //
//
/// \file
/// The backward's Q/dO ring (FLASHJIT_BWD_RING) copies by tensor maps where
/// the forward's K/V ring would (16-byte copies, the `tma` option): what
/// the dK/dV kernel records (kernels/KernelLaunch.h, in the backward ABI's
/// indices), what the cubin cache's text keeps, and the shape the backward
/// launcher gives each map for a launch (runtime/AttentionLauncher.h,
/// recordedMapShape). Compiled only; the GPU runs are bench/NOTES.md's.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/GpuDefaults.h"
#include "kernels/KernelABI.h"
#include "runtime/AttentionLauncher.h"
#include "tests/unit/runtime/ScopedEnv.h"

#include <gtest/gtest.h>

#include <optional>

using namespace flashjit;

namespace {

/// A causal d = 128 backward (64 x 128, 8 warps: two consumer warpgroups,
/// so the ring applies) on sm_90a, compiled with FLASHJIT_BWD_RING=2.
struct RingBackward {
  AttentionSpec spec;
  TileConfig config;
  GpuTarget target;
  RingBackward() {
    spec.direction = Direction::Backward;
    spec.headDimQK = spec.headDimV = 128;
    spec.mask = MaskKind::Causal;
    config = defaultGpuBackwardConfig(spec);
    target.arch = "sm_90a";
  }
  GpuCompilation compile() const {
    test::ScopedEnv ring("FLASHJIT_BWD_RING", "2");
    return compileForGpu(spec, config, target);
  }
};

/// The backward's Q/dO ring (FLASHJIT_BWD_RING) copies by tensor maps
/// where the forward's ring would (16-byte copies, FLASHJIT_TMA not 0):
/// the dK/dV kernel records Q's and dO's maps in the backward ABI's
/// indices, which the cubin cache's text keeps; FLASHJIT_TMA=0 leaves the
/// producer's cp.async copies and no maps.
TEST(BackwardRingMaps, RecordedInTheBackwardAbi) {
  namespace bwd = flashjit::abi::bwd;
  RingBackward r;
  const TileConfig &config = r.config;
  GpuCompilation c = r.compile();
  const KernelLaunch *main = findKernelLaunch(c.kernels, kKernelName);
  ASSERT_TRUE(main);
  ASSERT_EQ(main->tensorMaps.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const TensorMapRecord &m = main->tensorMaps[i];
    const bool isQ = i == 0;
    EXPECT_TRUE(m.backward);
    EXPECT_EQ(m.buffer, isQ ? bwd::Q : bwd::DO);
    EXPECT_EQ(m.rows, bwd::SeqQ);
    EXPECT_EQ(m.rowStride, isQ ? bwd::QStrideN : bwd::DOStrideN);
    EXPECT_EQ(m.outer,
              (std::vector<int>{isQ ? bwd::QStrideB : bwd::DOStrideB,
                                isQ ? bwd::QStrideH : bwd::DOStrideH}));
    EXPECT_EQ(m.cols, 128);
    EXPECT_EQ(m.boxRows, config.blockM);
    EXPECT_EQ(m.boxCols, 64);
  }
  EXPECT_EQ(main->describeTensorMaps(),
            "q [128 x seq_q (q_sn) x q_sb x q_sh, box 64 x 64], do [128 x "
            "seq_q (do_sn) x do_sb x do_sh, box 64 x 64]");
  // Two boxes of 64 columns per tile, in the producer's loop; no cp.async
  // arrivals.
  EXPECT_NE(c.ptx.find("cp.async.bulk.tensor.4d"), std::string::npos);
  EXPECT_NE(c.ptx.find("mbarrier.arrive.expect_tx"), std::string::npos);
  EXPECT_EQ(c.ptx.find("cp.async.mbarrier.arrive.noinc"), std::string::npos);
  auto parsed = parseKernelLaunches(formatKernelLaunches(c.kernels));
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(*parsed, c.kernels);

  GpuCompilation off;
  {
    test::ScopedEnv tma("FLASHJIT_TMA", "0");
    off = r.compile();
  }
  main = findKernelLaunch(off.kernels, kKernelName);
  ASSERT_TRUE(main);
  EXPECT_TRUE(main->tensorMaps.empty());
  EXPECT_EQ(off.ptx.find("cp.async.bulk.tensor"), std::string::npos);
  EXPECT_NE(off.ptx.find("cp.async.mbarrier.arrive.noinc"), std::string::npos);
}

/// Each map's shape for one launch: 128 columns, Nq rows seq_q apart by
/// the tensor's own row stride, then its batch and head dimensions (each
/// bounded by batch * heads) by its own strides, in bytes; boxes of 64
/// columns by Br rows. Strides that differ between Q and dO (a transposed
/// dO, a padded Q) show that each map reads its own tensor's arguments.
TEST(BackwardRingMaps, ShapedFromTheirTensorsArguments) {
  namespace bwd = flashjit::abi::bwd;
  RingBackward r;
  GpuCompilation c = r.compile();
  const KernelLaunch *main = findKernelLaunch(c.kernels, kKernelName);
  ASSERT_TRUE(main);
  ASSERT_EQ(main->tensorMaps.size(), 2u);
  Problem p;
  p.batch = 3;
  p.heads = 5;
  p.seqLenQ = 777;
  p.seqLenKV = 901;
  bwd::BackwardStrides s;
  // Q (B, H, N, d) padded to 136 columns; dO (B, N, H, d).
  s.q = {5 * 777 * 136, 777 * 136, 136, 1};
  s.dO = {777 * 5 * 128, 128, 5 * 128, 1};
  auto idx = bwd::indexArgs(r.spec, p, s);
  for (size_t i = 0; i < 2; ++i) {
    const bool isQ = i == 0;
    const std::array<int64_t, 4> &t = isQ ? s.q : s.dO;
    rt::TensorMapShape m =
        rt::recordedMapShape(main->tensorMaps[i], idx.data(), 15);
    EXPECT_EQ(m.rank, 4) << i;
    EXPECT_EQ(m.dims, (std::array<uint64_t, 5>{128, 777, 15, 15, 0})) << i;
    EXPECT_EQ(m.strideBytes,
              (std::array<uint64_t, 4>{uint64_t(2 * t[2]), uint64_t(2 * t[0]),
                                       uint64_t(2 * t[1]), 0}))
        << i;
    EXPECT_EQ(m.box,
              (std::array<uint32_t, 5>{64, uint32_t(r.config.blockM), 1, 1, 1}))
        << i;
  }
}

} // namespace
