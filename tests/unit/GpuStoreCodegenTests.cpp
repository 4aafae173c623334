//===- GpuStoreCodegenTests.cpp - Output stores, in the PTX ---------------===//
//
/// \file
/// The forward's output tile goes through the dead Q slot
/// (KernelPlacement::stagedStores) wherever its conditions hold, and is
/// stored element by element elsewhere; the backward's atomic dQ goes
/// through a staging tile and a bulk reduction (KernelPlacement::dqStageCols)
/// where its conditions hold: checked on the PTX, no GPU needed.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/KernelABI.h"
#include "tests/unit/AttentionCases.h"
#include "tests/unit/runtime/ScopedEnv.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <set>
#include <string>

using namespace flashjit;
using flashjit::test::ScopedEnv;
using flashjit::test::tileConfig;

namespace {

/// How often \p needle occurs in \p text.
size_t occurrences(const std::string &text, const std::string &needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + needle.size()))
    ++n;
  return n;
}

/// The forward stores O through the dead Q slot (KernelPlacement::
/// stagedStores): one 16-byte vector store per 8 columns of a row (twice
/// where a full block's copy skips the row tests) and no 2-byte stores, on
/// every forward path with 16-byte copies (mma.sync, the warpgroup tiles, the
/// ring with two and three consumer warpgroups); element by element where the
/// copies are narrower (O's rows may be unaligned), where grid.z splits O's
/// columns (dv > 256) and with FLASHJIT_STAGED_STORES=0.
TEST(GpuStoreCodegen, ForwardStoresWholeRowsThroughShared) {
  struct Case {
    int64_t d, dv;
    MaskKind mask;
    TileConfig config;
    const char *arch;
    int64_t copyBytes;
    size_t vectorStores; ///< 0: the element-wise store
  };
  TileConfig ring = tileConfig(128, 128, 8);
  ring.stages = 2;
  ring.overlapSoftmax = true;
  TileConfig three = tileConfig(192, 128, 12);
  three.stages = 2;
  // Per thread: the warp's 16 rows x dv / 8 chunks over 32 lanes (rounded
  // up: one guarded round for the rest).
  const Case cases[] = {
      {128, 128, MaskKind::None, ring, "sm_90a", 16, 8},
      {128, 128, MaskKind::Causal, ring, "sm_90a", 16, 8},
      {96, 96, MaskKind::None, three, "sm_90a", 16, 6},
      {64, 64, MaskKind::None, tileConfig(64, 128, 4), "sm_90a", 16, 4},
      {64, 64, MaskKind::SlidingWindow, tileConfig(128, 64, 4), "sm_80", 16, 8},
      {200, 72, MaskKind::None, tileConfig(64, 64, 4), "sm_80", 16, 5},
      {128, 128, MaskKind::None, ring, "sm_90a", 8, 0},
      {64, 512, MaskKind::None, tileConfig(64, 32, 4), "sm_80", 16, 0},
  };
  for (const Case &c : cases) {
    AttentionSpec spec;
    spec.headDimQK = c.d;
    spec.headDimV = c.dv;
    spec.mask = c.mask;
    GpuTarget target;
    target.arch = c.arch;
    target.copyBytes = c.copyBytes;
    SCOPED_TRACE(spec.name() + " " + c.config.toJson() + " " + c.arch +
                 " copy " + std::to_string(c.copyBytes));
    std::string ptx = compileToPtx(spec, c.config, target);
    // Where a round covers whole rows (8 columns x chunks dividing 32, no
    // row groups) a full block's copy, unchecked, comes beside the checked
    // one (T30): up to twice the stores, less those LLVM sinks into one.
    const int n = occurrences(ptx, "st.global.v4.b32");
    const int v = int(c.vectorStores), chunks = 2 * v; // 16 rows a warp
    if (v > 0 && 32 % chunks == 0) {
      EXPECT_GT(n, v);
      EXPECT_LE(n, 2 * v);
    } else {
      EXPECT_EQ(n, v);
    }
    EXPECT_EQ(occurrences(ptx, "st.global.b16") == 0, c.vectorStores > 0);
  }
  AttentionSpec spec;
  GpuTarget target;
  std::string text, ptx;
  {
    ScopedEnv staged("FLASHJIT_STAGED_STORES", "0");
    text = gpuPipelineText(ring, target);
    ptx = compileToPtx(spec, ring, target);
  }
  EXPECT_NE(text.find("staged-stores=false"), std::string::npos) << text;
  EXPECT_EQ(occurrences(ptx, "st.global.v4.b32"), 0u);
  EXPECT_GT(occurrences(ptx, "st.global.b16"), 0u);
  // The forward's option is on by default (the backward's,
  // bwd-staged-stores, is its own).
  EXPECT_EQ(gpuPipelineText(ring, target).find(" staged-stores"),
            std::string::npos);
}

/// Where the producer copies Q by its tensor map (FLASHJIT_TMA=qkv) it
/// refills Q's slot for the next tile, so O is staged through a slot of
/// its own (KernelPlacement::outputStagingBytes): Br x dv after every
/// other slot, recorded in the launch's shared memory; one persistent and
/// one per tile, both with 16-byte stores only. Where that slot does not
/// fit beside three stages, O is stored element by element (before T30,
/// always with Q by its tensor map).
TEST(GpuStoreCodegen, QueryByTensorMapStagesOThroughItsOwnSlot) {
  AttentionSpec spec;
  GpuTarget target;
  TileConfig config = tileConfig(128, 128, 8);
  config.overlapSoftmax = true;
  const int64_t plainShared =
      compileForGpu(spec, config, target).kernels.at(0).sharedBytes;
  ScopedEnv tma("FLASHJIT_TMA", "qkv");
  for (const char *persistent : {"0", "1"}) {
    SCOPED_TRACE(std::string("persistent ") + persistent);
    ScopedEnv p("FLASHJIT_PERSISTENT", persistent);
    GpuCompilation c = compileForGpu(spec, config, target);
    ASSERT_EQ(c.kernels.size(), 1u);
    EXPECT_EQ(c.kernels[0].tensorMaps.size(), 3u);
    EXPECT_EQ(c.kernels[0].sharedBytes,
              (plainShared + 1023) / 1024 * 1024 + 128 * 128 * 2);
    EXPECT_GT(occurrences(c.ptx, "st.global.v4.b32"), 0);
    EXPECT_EQ(occurrences(c.ptx, "st.global.b16"), 0);
  }
  config.stages = 3;
  ScopedEnv persistent("FLASHJIT_PERSISTENT", "1"); // as the loop's last
  GpuCompilation deep = compileForGpu(spec, config, target);
  EXPECT_LE(deep.kernels.at(0).sharedBytes, 227 * 1024);
  EXPECT_EQ(occurrences(deep.ptx, "st.global.v4.b32"), 0);
  EXPECT_GT(occurrences(deep.ptx, "st.global.b16"), 0);
}

/// With FLASHJIT_TMA=qkvo (KernelPlacement::tma 3) O leaves its own slot
/// by a fourth tensor map: O's buffer, seq_q rows o_sn apart, dv columns,
/// boxes of 64 columns by a warp's 16 rows; each warp's lane 0 stores one
/// box per 64-column block (d 96: two, the second past dv clipped by the
/// map), after a proxy fence, and waits until they are read; no thread
/// stores O itself. Same shared memory as qkv. Where O has no slot of its
/// own (three stages) nothing changes: three maps, O by 2-byte stores.
TEST(GpuStoreCodegen, OByItsTensorMap) {
  const std::string store =
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group";
  for (int64_t d : {int64_t(128), int64_t(96)})
    for (const char *persistent : {"0", "1"}) {
      SCOPED_TRACE("d " + std::to_string(d) + " persistent " + persistent);
      AttentionSpec spec;
      spec.headDimQK = spec.headDimV = d;
      GpuTarget target;
      TileConfig config = tileConfig(128, 128, 8);
      config.overlapSoftmax = true;
      ScopedEnv p("FLASHJIT_PERSISTENT", persistent);
      std::optional<ScopedEnv> tma;
      tma.emplace("FLASHJIT_TMA", "qkv");
      GpuCompilation qkv = compileForGpu(spec, config, target);
      tma.emplace("FLASHJIT_TMA", "qkvo");
      GpuCompilation qkvo = compileForGpu(spec, config, target);
      ASSERT_EQ(qkvo.kernels.size(), 1u);
      const KernelLaunch &k = qkvo.kernels[0];
      EXPECT_EQ(k.sharedBytes, qkv.kernels.at(0).sharedBytes);
      EXPECT_EQ(qkv.kernels.at(0).tensorMaps.size(), 3u);
      ASSERT_EQ(k.tensorMaps.size(), 4u);
      const TensorMapRecord &o = k.tensorMaps[3];
      EXPECT_STREQ(flashjit::abi::bufferName(o.buffer), "o");
      EXPECT_STREQ(flashjit::abi::indexArgName(o.rows), "seq_q");
      EXPECT_STREQ(flashjit::abi::indexArgName(o.rowStride), "o_sn");
      EXPECT_EQ(o.cols, d);
      EXPECT_EQ(o.boxCols, 64);
      EXPECT_EQ(o.boxRows, 16);
      EXPECT_EQ(occurrences(qkvo.ptx, store), 2u);
      EXPECT_EQ(occurrences(qkvo.ptx, "cp.async.bulk.commit_group"), 1u);
      EXPECT_EQ(occurrences(qkvo.ptx, "cp.async.bulk.wait_group.read 0"), 1u);
      EXPECT_EQ(occurrences(qkvo.ptx, "fence.proxy.async.shared::cta"), 1u);
      EXPECT_EQ(occurrences(qkvo.ptx, "st.global.v4.b32"), 0u);
      EXPECT_EQ(occurrences(qkvo.ptx, "st.global.b16"), 0u);
      EXPECT_EQ(occurrences(qkv.ptx, store), 0u);
      EXPECT_GT(occurrences(qkv.ptx, "st.global.v4.b32"), 0u);
    }
  AttentionSpec spec;
  // The tiling's own flag (`--output-tma`, "output_tma"), no environment.
  TileConfig flagged = tileConfig(128, 128, 8);
  flagged.overlapSoftmax = true;
  flagged.queryByTensorMap = flagged.outputByTensorMap = true;
  GpuCompilation byFlag = compileForGpu(spec, flagged, GpuTarget());
  EXPECT_EQ(byFlag.kernels.at(0).tensorMaps.size(), 4u);
  EXPECT_EQ(occurrences(byFlag.ptx, store), 2u);
  flagged.queryByTensorMap = false;
  EXPECT_THROW(flagged.validate(spec), SpecError) << "O's map needs Q's";
  TileConfig deep = tileConfig(128, 128, 8);
  deep.overlapSoftmax = true;
  deep.stages = 3;
  ScopedEnv tma("FLASHJIT_TMA", "qkvo");
  GpuCompilation c = compileForGpu(spec, deep, GpuTarget());
  EXPECT_EQ(c.kernels.at(0).tensorMaps.size(), 3u);
  EXPECT_EQ(occurrences(c.ptx, store), 0u);
  EXPECT_GT(occurrences(c.ptx, "st.global.b16"), 0u);
}

/// With FLASHJIT_BULK_DQ=1 the dK/dV kernel on warpgroup MMAs adds each
/// step's dQ tile with one bulk reduction from its staging tile
/// (GpuBackwardGeometry::bulkDq): the warpgroups' stores (a pair per 8
/// columns and half of the thread's rows), one copy whose bytes are the
/// rows that exist, a wait for the last step's reads before the tile is
/// written again and for every copy before the kernel returns; the
/// threads' reductions stay for an unaligned dq_accum. Not where dQ's
/// columns are no multiple of 16, without warpgroup MMAs (sm_90, the
/// separate dQ pass), with dq_accum in quad order (the default since T41;
/// FLASHJIT_DQ_QUAD_ORDER=0 here), nor by default.
TEST(GpuStoreCodegen, BackwardDqTileInBulk) {
  struct Case {
    int64_t dqk;
    MaskKind mask;
    bool deterministic;
    TileConfig config;
    const char *arch;
    int64_t stores; ///< st.shared.v2 per thread; 0: no bulk reductions
  };
  const Case cases[] = {
      {128, MaskKind::None, false, tileConfig(64, 128, 8), "sm_90a", 16},
      {64, MaskKind::None, false, tileConfig(64, 128, 8), "sm_90a", 16},
      {96, MaskKind::Causal, false, tileConfig(64, 128, 8), "sm_90a", 24},
      {128, MaskKind::None, false, tileConfig(64, 64, 4), "sm_90a", 32},
      {33, MaskKind::None, false, tileConfig(64, 64, 4), "sm_90a", 0},
      {128, MaskKind::None, false, tileConfig(64, 128, 8), "sm_90", 0},
      {128, MaskKind::None, true, tileConfig(64, 64, 4), "sm_90a", 0},
  };
  const std::string bulk =
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32";
  std::optional<ScopedEnv> bulkOn, columns;
  bulkOn.emplace("FLASHJIT_BULK_DQ", "1");
  // Bulk reductions stage dQ in column order: dq_accum's quad order (the
  // default since T41) turns them off.
  columns.emplace("FLASHJIT_DQ_QUAD_ORDER", "0");
  for (const Case &c : cases) {
    AttentionSpec spec;
    spec.direction = Direction::Backward;
    spec.headDimQK = spec.headDimV = c.dqk;
    spec.mask = c.mask;
    spec.deterministic = c.deterministic;
    GpuTarget target;
    target.arch = c.arch;
    SCOPED_TRACE(spec.name() + " " + c.config.toJson() + " " + c.arch);
    std::string ptx = compileToPtx(spec, c.config, target);
    const size_t on = c.stores ? 1 : 0;
    EXPECT_EQ(occurrences(ptx, bulk), on);
    EXPECT_EQ(occurrences(ptx, "cp.async.bulk.wait_group.read 0;"), on);
    EXPECT_EQ(occurrences(ptx, "cp.async.bulk.wait_group 0;"), on);
    EXPECT_EQ(occurrences(ptx, "st.shared.v2.b32"), size_t(c.stores));
    EXPECT_EQ(occurrences(ptx, "red.global.add") > 0, !c.deterministic);
  }
  AttentionSpec spec;
  spec.direction = Direction::Backward;
  TileConfig config = tileConfig(64, 128, 8);
  GpuTarget target;
  target.arch = "sm_90a";
  EXPECT_NE(gpuPipelineText(config, target).find(" bulk-dq=true"),
            std::string::npos);
  columns.reset();
  EXPECT_EQ(gpuPipelineText(config, target).find("bulk-dq"), std::string::npos);
  EXPECT_EQ(occurrences(compileToPtx(spec, config, target), bulk), 0u);
  bulkOn.reset();
  ScopedEnv bulkOff("FLASHJIT_BULK_DQ", nullptr);
  EXPECT_EQ(gpuPipelineText(config, target).find("bulk-dq"), std::string::npos);
  EXPECT_EQ(occurrences(compileToPtx(spec, config, target), bulk), 0u);
}

/// The number after \p prefix in \p ptx (its first occurrence), or -1.
static int64_t numberAfter(const std::string &ptx, const std::string &prefix) {
  size_t at = ptx.find(prefix);
  return at == std::string::npos
             ? -1
             : std::strtoll(ptx.c_str() + at + prefix.size(), nullptr, 10);
}

/// A ring kernel's setmaxnreg split stays inside what its launch allocates:
/// setmaxnreg.inc waits until the block's own warps have given the
/// registers back, so the producer's count plus the consumers' must not
/// pass the block's threads times 65,536 / threads rounded down to 8 (168
/// at 384 threads). T27's backward ring split 32 + 2 x 240 = 512 > 504 and
/// hung on the GPU.
/// The main kernel's text in \p module: from its .entry to the next one
/// ("" if none).
static std::string mainKernelPtx(const std::string &module) {
  size_t begin = module.find(".entry attention(");
  return begin == std::string::npos
             ? ""
             : module.substr(begin, module.find(".entry", begin + 1) - begin);
}

static void expectSplitFitsLaunch(const std::string &module) {
  const std::string ptx = mainKernelPtx(module);
  ASSERT_FALSE(ptx.empty());
  const int64_t threads = numberAfter(ptx, ".maxntid ");
  const int64_t producer = numberAfter(ptx, "setmaxnreg.dec.sync.aligned.u32 ");
  const int64_t consumer = numberAfter(ptx, "setmaxnreg.inc.sync.aligned.u32 ");
  ASSERT_GT(threads, 128);
  ASSERT_GT(producer, 0);
  ASSERT_GT(consumer, 0);
  const int64_t groups = threads / 128;
  EXPECT_LE(producer + (groups - 1) * consumer,
            65536 / threads / 8 * 8 * groups)
      << "producer " << producer << ", " << groups - 1 << " consumers of "
      << consumer << " at " << threads << " threads";
}

/// The warpgroup MMAs that write \p ptx's products without reading an
/// accumulator: those whose scale-d predicate comes from a register set to
/// 0 (`mov.b32 %rN, 0;` then `setp.ne.b32 p, %rN, 0; wgmma...`).
static int64_t nonAccumulatingMmas(const std::string &ptx) {
  std::set<std::string> zero;
  size_t at = 0;
  const std::string mov = "mov.b32 \t%r";
  while ((at = ptx.find(mov, at)) != std::string::npos) {
    size_t end = ptx.find(';', at);
    std::string line =
        ptx.substr(at + mov.size() - 2, end - at - mov.size() + 2);
    if (line.size() > 3 && line.compare(line.size() - 3, 3, ", 0") == 0)
      zero.insert(line.substr(0, line.size() - 3));
    at = end;
  }
  int64_t count = 0;
  const std::string setp = "setp.ne.b32 p, ";
  for (at = ptx.find(setp); at != std::string::npos;
       at = ptx.find(setp, at + 1)) {
    size_t reg = at + setp.size();
    if (zero.count(ptx.substr(reg, ptx.find(',', reg) - reg)))
      ++count;
  }
  return count;
}

/// The sm_90a PTX of a forward at head dim \p d tiled by \p config,
/// with the overlapped loop where \p overlapped.
static std::string hopperForwardPtx(int64_t d, TileConfig config,
                                    bool overlapped = false) {
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = d;
  GpuTarget target;
  target.arch = "sm_90a";
  config.overlapSoftmax = overlapped;
  return compileToPtx(spec, config, target);
}

/// A product without an accumulator (S = Q K^T) starts with scale-d 0:
/// no register is zeroed for it, in the overlapped loop each step (T28:
/// 64 instructions a step fewer at d = 128). Its first MMA of each such
/// product, the prologue's S and the loop's next S.
TEST(GpuWgmma, ProductsWithoutAccumulatorStartUnscaled) {
  const TileConfig config = tileConfig(128, 128, 8);
  EXPECT_EQ(nonAccumulatingMmas(hopperForwardPtx(128, config, true)), 2);
  EXPECT_EQ(nonAccumulatingMmas(hopperForwardPtx(128, config)), 1);
}

/// The overlapped loop in FlashAttention-3's order: the next S and P V are
/// committed apart and the softmax waits for the first only (wait_group 1,
/// P V still in flight), and the plain loop waits for everything; the
/// last block's P V comes after the loop (its V a ring epilogue load).
TEST(GpuWgmma, OverlappedLoopLeavesPVInFlight) {
  const TileConfig config = tileConfig(128, 128, 8);
  const std::string overlapped = hopperForwardPtx(128, config, true);
  const std::string plain = hopperForwardPtx(128, config);
  EXPECT_EQ(occurrences(overlapped, "wgmma.wait_group.sync.aligned 1;"), 1)
      << overlapped;
  EXPECT_EQ(occurrences(plain, "wgmma.wait_group.sync.aligned 1;"), 0);
  // Four products of 8 MMAs (S before the loop, S and P V in it, the last
  // block's P V after it) against the plain loop's two.
  EXPECT_EQ(occurrences(overlapped, "wgmma.mma_async"),
            2 * occurrences(plain, "wgmma.mma_async"));
  // Each step's P is rounded once, as in the plain kernel (LLVM merges the
  // prologue's rounding with the back edge's): 32 pairs a thread, and 32
  // for O's store.
  EXPECT_EQ(occurrences(overlapped, "cvt.rn.bf16x2.f32"),
            occurrences(plain, "cvt.rn.bf16x2.f32"));
}

/// Every forward ring that moves registers fits its launch too: 128 x 128
/// at d = 128 with the overlapped loop (24 + 2 x 240) and three consumer
/// warpgroups at d = 64 (24 + 3 x 160).
TEST(GpuRingRegisters, SplitFitsLaunch) {
  expectSplitFitsLaunch(
      hopperForwardPtx(128, tileConfig(128, 128, 8), /*overlapped=*/true));
  expectSplitFitsLaunch(hopperForwardPtx(64, tileConfig(192, 128, 12)));
}

/// The backward at d = 128 on its default warpgroup tiling (64 x 128, 8
/// warps) for sm_90a.
struct HopperBackward {
  AttentionSpec spec;
  TileConfig config = tileConfig(64, 128, 8);
  GpuTarget target;
  HopperBackward() {
    spec.direction = Direction::Backward;
    spec.headDimQK = spec.headDimV = 128;
    target.arch = "sm_90a";
  }
};

/// An opt-in knob of the backward: \p var = \p on puts \p flag in the
/// pipeline text (part of the cache key) on sm_90a; sm_80 (no warpgroup
/// MMAs), \p var = \p off and no \p var leave \p flag out.
static void expectOptInRecorded(const char *var, const char *on,
                                const char *off, const std::string &flag) {
  HopperBackward h;
  std::optional<ScopedEnv> env;
  env.emplace(var, on);
  EXPECT_NE(gpuPipelineText(h.config, h.target).find(flag), std::string::npos)
      << var << "=" << on;
  h.target.arch = "sm_80";
  EXPECT_EQ(gpuPipelineText(h.config, h.target).find(flag), std::string::npos);
  h.target.arch = "sm_90a";
  env.emplace(var, off);
  EXPECT_EQ(gpuPipelineText(h.config, h.target).find(flag), std::string::npos)
      << var << "=" << off;
  env.emplace(var, nullptr);
  EXPECT_EQ(gpuPipelineText(h.config, h.target).find(flag), std::string::npos);
}

/// The backward's Q/dO ring (FLASHJIT_BWD_RING=S, S in 2..4, warpgroup
/// MMAs): the pipeline text records the stages, and the dK/dV kernel has a
/// producer warpgroup that hands its registers to the consumers; any other
/// value, or none, leaves the loop's own copies.
TEST(GpuBackwardRing, OptInRecordedAndLowered) {
  expectOptInRecorded("FLASHJIT_BWD_RING", "3", "1", " bwd-ring-stages=3");
  HopperBackward h;
  std::optional<ScopedEnv> ring;
  ring.emplace("FLASHJIT_BWD_RING", "3");
  std::string ptx = compileToPtx(h.spec, h.config, h.target);
  EXPECT_EQ(occurrences(ptx, "setmaxnreg.dec.sync.aligned.u32 24;"), 1u);
  EXPECT_EQ(occurrences(ptx, "setmaxnreg.inc.sync.aligned.u32 240;"), 1u);
  EXPECT_EQ(occurrences(ptx, ".maxntid 384, 1, 1"), 1u);
  expectSplitFitsLaunch(ptx);
  // Full and empty barriers of Q and dO per stage.
  EXPECT_EQ(occurrences(ptx, "mbarrier.init.shared::cta.b64"), 12u);
  ring.emplace("FLASHJIT_BWD_RING", nullptr);
  ptx = compileToPtx(h.spec, h.config, h.target);
  EXPECT_EQ(occurrences(ptx, "setmaxnreg"), 0u);
  EXPECT_EQ(occurrences(ptx, ".maxntid 256, 1, 1"), 1u);
}

/// Split commits (warpgroup MMAs; the default since T33,
/// FLASHJIT_BWD_SPLIT_COMMITS=0 turns them off): recorded in the pipeline
/// text, and the dK/dV kernel's readers wait for their own groups (three
/// wait_group 1 a step: P for S^T, dS for dP^T, dQ's reductions for dQ),
/// where without them each waits for every group in flight.
TEST(GpuBackwardSplitCommits, DefaultRecordedAndLowered) {
  HopperBackward h;
  std::optional<ScopedEnv> split;
  split.emplace("FLASHJIT_BWD_SPLIT_COMMITS", nullptr);
  const std::string flag = " split-commits=true";
  EXPECT_NE(gpuPipelineText(h.config, h.target).find(flag), std::string::npos);
  std::string ptx = compileToPtx(h.spec, h.config, h.target);
  EXPECT_EQ(occurrences(ptx, "wgmma.wait_group.sync.aligned 1;"), 3u);
  split.emplace("FLASHJIT_BWD_SPLIT_COMMITS", "1");
  EXPECT_NE(gpuPipelineText(h.config, h.target).find(flag), std::string::npos);
  split.emplace("FLASHJIT_BWD_SPLIT_COMMITS", "0");
  EXPECT_EQ(gpuPipelineText(h.config, h.target).find(flag), std::string::npos);
  ptx = compileToPtx(h.spec, h.config, h.target);
  EXPECT_EQ(occurrences(ptx, "wgmma.wait_group.sync.aligned 1;"), 0u);
  split.emplace("FLASHJIT_BWD_SPLIT_COMMITS", nullptr);
  h.target.arch = "sm_80"; // no warpgroup MMAs
  EXPECT_EQ(gpuPipelineText(h.config, h.target).find("split-commits"),
            std::string::npos);
}

} // namespace

/// The backward's staged dK/dV stores (the default on warpgroup MMAs since
/// T40; FLASHJIT_BWD_STAGED_STORES=0 turns them off): recorded in the
/// pipeline text, and the dK/dV kernel stores dK and dV through V's slot,
/// dead after the loop, as the forward stores O: 16-byte vector stores and
/// no 2-byte ones, with a warp-level ordering point between the two tiles'
/// use of the slot (the lanes read each other's chunks). Off, element by
/// element, as before T40; on sm_80 off unless asked for (=1).
TEST(GpuStoreCodegen, BackwardStagedStoresByDefault) {
  HopperBackward h;
  const std::string flag = " bwd-staged-stores=true";
  {
    GpuTarget ampere = h.target;
    ampere.arch = "sm_80";
    ScopedEnv unset("FLASHJIT_BWD_STAGED_STORES", nullptr);
    EXPECT_EQ(gpuPipelineText(h.config, ampere).find(flag), std::string::npos);
    ScopedEnv on("FLASHJIT_BWD_STAGED_STORES", "1");
    EXPECT_NE(gpuPipelineText(h.config, ampere).find(flag), std::string::npos);
  }
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal);
    h.spec.mask = causal ? MaskKind::Causal : MaskKind::None;
    std::string plain, staged;
    {
      ScopedEnv off("FLASHJIT_BWD_STAGED_STORES", "0");
      EXPECT_EQ(gpuPipelineText(h.config, h.target).find(flag),
                std::string::npos);
      plain = mainKernelPtx(compileToPtx(h.spec, h.config, h.target));
    }
    {
      ScopedEnv unset("FLASHJIT_BWD_STAGED_STORES", nullptr);
      EXPECT_NE(gpuPipelineText(h.config, h.target).find(flag),
                std::string::npos);
      staged = mainKernelPtx(compileToPtx(h.spec, h.config, h.target));
    }
    ASSERT_FALSE(plain.empty());
    ASSERT_FALSE(staged.empty());
    EXPECT_EQ(occurrences(plain, "st.global.v4.b32"), 0u);
    EXPECT_EQ(occurrences(plain, "st.global.b16"), 128u); // dK, dV: 64 each
    EXPECT_GE(occurrences(staged, "st.global.v4.b32"), 16u);
    EXPECT_EQ(occurrences(staged, "st.global.b16"), 0u);
    EXPECT_EQ(occurrences(staged, "bar.warp.sync"),
              occurrences(plain, "bar.warp.sync") + 3);
  }
}

/// Three stages by default (T41; FLASHJIT_BWD_STAGES=2 keeps two):
/// recorded in the pipeline text; the dK/dV kernel's own Q/dO pipeline
/// gets a third stage (its bytes: Q, dO and their statistics) and each step
/// waits for its copies with the next step's group still in flight
/// (cp.async.wait_group 1 where two stages wait for all); the staged dK/dV
/// stores stay.
TEST(GpuStoreCodegen, BackwardThirdStageByDefault) {
  HopperBackward h;
  std::string two, three;
  int64_t twoBytes = 0, threeBytes = 0;
  // The dK/dV kernel's dynamic shared memory, as recorded for launch.
  auto shared = [&](const TileConfig &config) {
    for (const KernelLaunch &k : gpuKernelLaunches(h.spec, config, h.target))
      if (k.name == kKernelName)
        return k.sharedBytes;
    ADD_FAILURE() << "no dK/dV kernel recorded";
    return int64_t(0);
  };
  {
    ScopedEnv off("FLASHJIT_BWD_STAGES", "2");
    EXPECT_EQ(gpuPipelineText(h.config, h.target).find("bwd-stages"),
              std::string::npos);
    two = mainKernelPtx(compileToPtx(h.spec, h.config, h.target));
    twoBytes = shared(h.config);
  }
  {
    ScopedEnv unset("FLASHJIT_BWD_STAGES", nullptr);
    EXPECT_NE(gpuPipelineText(h.config, h.target).find(" bwd-stages=3"),
              std::string::npos);
    three = mainKernelPtx(compileToPtx(h.spec, h.config, h.target));
    threeBytes = shared(h.config);
  }
  ASSERT_FALSE(two.empty());
  ASSERT_FALSE(three.empty());
  EXPECT_EQ(occurrences(two, "cp.async.wait_group \t1;"), 0u);
  EXPECT_EQ(occurrences(three, "cp.async.wait_group \t1;"), 1u);
  EXPECT_EQ(occurrences(three, "cp.async.wait_all;") + 1,
            occurrences(two, "cp.async.wait_all;"));
  // One more stage: Q and dO (64 x 128 x 2 bytes each) and the two rows
  // of statistics, rounded to the slots' 1024-byte alignment.
  const int64_t stage = 2 * 64 * 128 * 2 + 1024;
  EXPECT_EQ(threeBytes - twoBytes, stage);
  EXPECT_EQ(occurrences(three, "st.global.b16"), 0u);
  // 192 keys a program: K and V (192 x 128 each), two stages and dS^T
  // (192 x 64) take 190,464 bytes; the third stage still fits the 232,448
  // of an sm_90a block, so it is taken (the placement counts no P^T tile,
  // which warpgroup MMAs never stage).
  TileConfig wide = tileConfig(64, 192, 12);
  EXPECT_EQ(shared(wide), 2 * 192 * 256 + 3 * stage + 192 * 64 * 2);
  ScopedEnv off("FLASHJIT_BWD_STAGES", "2");
  EXPECT_EQ(shared(wide), 2 * 192 * 256 + 2 * stage + 192 * 64 * 2);
}
