//===- KernelLaunchTests.cpp - Recorded launch resources, on the CPU ------===//
//
/// \file
/// The launch resources the GPU lowering records on every kernel
/// (kernels/KernelLaunch.h) are what the launchers use: compileForGpu reads
/// them for every kernel of the forward and the backward, their grids are
/// the ones the tiling's program ids cover, the cubin cache keeps them
/// beside the cubin (an entry of an older format, or with a damaged record,
/// is rebuilt), and a launcher refuses an image that does not record its
/// kernel.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/GpuDefaults.h"
#include "kernels/KernelABI.h"
#include "runtime/AttentionLauncher.h"
#include "runtime/Error.h"
#include "tests/unit/runtime/ScopedEnv.h"
#include "tools/engine/KernelProvider.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <sstream>

using namespace flashjit;

namespace {

AttentionSpec spec(Direction direction, int64_t d, MaskKind mask, int64_t gqa,
                   bool deterministic = false) {
  AttentionSpec s;
  s.direction = direction;
  s.headDimQK = s.headDimV = d;
  s.mask = mask;
  s.gqaGroup = gqa;
  s.deterministic = deterministic;
  return s;
}

/// A problem whose sequence lengths are no multiple of any tile.
Problem oddProblem() {
  Problem p;
  p.batch = 3;
  p.heads = 4;
  p.seqLenQ = 301;
  p.seqLenKV = 517;
  return p;
}

TEST(KernelLaunch, FormatAndParseRoundTrip) {
  std::vector<KernelLaunch> ks(2);
  ks[0] = {"attention", 256, 133120, 128, true, true, 2};
  ks[1] = {"attention_dq", 128, 0, 64, false, false, 1};
  ks.push_back({"attention", 32, 9216, 16, false, true, 1, /*kvSplit=*/true});
  ks.push_back({"attention", 384, 163904, 128, false, false, 1,
                /*kvSplit=*/false, /*persistent=*/true});
  KernelLaunch tma = ks.back();
  tma.persistent = false;
  tma.tensorMaps = {{flashjit::abi::K,
                     flashjit::abi::SeqKV,
                     flashjit::abi::KStrideN,
                     {flashjit::abi::KStrideB},
                     96,
                     128,
                     64},
                    {flashjit::abi::V,
                     flashjit::abi::SeqKV,
                     flashjit::abi::VStrideN,
                     {flashjit::abi::VStrideB, flashjit::abi::VStrideH},
                     256,
                     64,
                     64}};
  ks.push_back(tma);
  KernelLaunch scheduled = ks[3];
  scheduled.scheduled = true;
  scheduled.tensorMaps = tma.tensorMaps;
  ks.push_back(scheduled);
  // A backward ring's map, in the backward ABI's indices.
  KernelLaunch bwdRing = tma;
  bwdRing.tensorMaps = {
      {flashjit::abi::bwd::DO,
       flashjit::abi::bwd::SeqQ,
       flashjit::abi::bwd::DOStrideN,
       {flashjit::abi::bwd::DOStrideB, flashjit::abi::bwd::DOStrideH},
       128,
       64,
       64,
       /*backward=*/true}};
  ks.push_back(bwdRing);
  auto parsed = parseKernelLaunches(formatKernelLaunches(ks));
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(*parsed, ks);
  // Malformed records are refused, never half read.
  for (const char *bad :
       {"attention 256 0 128 keys kv\n", "attention 256 0 128 rows kv 1\n",
        "attention 256 0 128 keys some 1\n", "attention 0 0 128 keys kv 1\n",
        "attention 256 -1 128 keys kv 1\n", "attention 256 0 0 keys kv 1\n",
        "attention 256 0 128 keys kv 1 extra\n",
        "attention 2048 0 1 keys kv 1\n",
        "attention 256 0 128 keys kv 1 split extra\n",
        "attention 256 0 128 keys kv 1 persistent persistent\n",
        "attention 256 0 128 keys kv 1 persistent split\n",
        "attention 256 0 128 keys kv 1 scheduled\n",
        "attention 256 0 128 keys kv 1 scheduled persistent\n",
        "attention 256 0 128 keys kv 1 persistent scheduled scheduled\n",
        "attention 256 0 128 keys kv 1 tma=1/3/9/128/64\n",
        "attention 256 0 128 keys kv 1 tma=1/3/9/128/64/64/7/8/9/10\n",
        "attention 256 0 128 keys kv 1 tma=1/3/9/128/512/64/7\n",
        "attention 256 0 128 keys kv 1 tma=9/3/9/128/64/64/7\n",
        "attention 256 0 128 keys kv 1 tma=1/3/99/128/64/64/7\n",
        "attention 256 0 128 keys kv 1 tma=1/3/-9/128/64/64\n",
        "attention 256 0 128 keys kv 1 tma=1/3/9/128/64/64 split\n",
        // Index 30 is only the backward's (its win_left); 17 and 40 are
        // past the backward's buffers and index arguments.
        "attention 256 0 128 keys kv 1 tma=4/2/30/128/64/64/16\n",
        "attention 256 0 128 keys kv 1 bwd-tma=17/2/18/128/64/64/16\n",
        "attention 256 0 128 keys kv 1 bwd-tma=4/2/40/128/64/64/16\n"})
    EXPECT_FALSE(parseKernelLaunches(bad).has_value()) << bad;
}

/// The forward's record (read by compileForGpu, which also makes the
/// PTX): the launcher's threads and shared memory, and a grid of
/// ceil(Nq / Br) x B * H x the V column chunks (two past 256).
TEST(KernelLaunch, ForwardRecordsItsGrid) {
  GpuTarget target;
  target.arch = "sm_90a";
  Problem p = oddProblem();
  for (int64_t d : {64, 320}) {
    AttentionSpec s = spec(Direction::Forward, d, MaskKind::Causal, 2);
    TileConfig config = defaultGpuConfig(s);
    GpuCompilation c = compileForGpu(s, config, target);
    ASSERT_EQ(c.kernels.size(), 1u);
    const KernelLaunch &k = c.kernels[0];
    GpuGeometry geo = gpuGeometry(s, config);
    EXPECT_EQ(k.name, kKernelName);
    EXPECT_EQ(k.threads, geo.threads);
    EXPECT_EQ(k.sharedBytes, geo.sharedBytes);
    EXPECT_EQ(k.grid(p, s.gqaGroup), geo.grid(p, config)) << "d = " << d;
    EXPECT_EQ(k.programsZ, d > 256 ? 2 : 1);
  }
}

/// With FLASHJIT_PERSISTENT=1 the ring's forward records a persistent
/// grid: at most the launch's programs along x (all the tiles, Q blocks x
/// B * H, when fewer), 1 along y, the column chunks along z; the same
/// threads and shared memory as without, and a loop over the tiles in its
/// kernel (the grid's size read). Without the ring it is not persistent.
/// Causal, it is scheduled: it takes a tile schedule (a pointer before its
/// tensor maps, null for the stride) and its loop's bounds and step come
/// from it or from the grid; unmasked, it is not, and steps by the grid.
TEST(KernelLaunch, PersistentForwardRecordsItsGrid) {
  GpuTarget target;
  target.arch = "sm_90a";
  Problem p = oddProblem(); // 3 Q blocks of 128 x 12 heads: 36 tiles
  AttentionSpec s = spec(Direction::Forward, 128, MaskKind::Causal, 2);
  TileConfig config;
  config.blockM = config.blockN = 128;
  config.warps = 8;
  std::optional<test::ScopedEnv> persistent;
  persistent.emplace("FLASHJIT_PERSISTENT", "1");
  GpuCompilation c = compileForGpu(s, config, target);
  const std::string gpu = emitStage(s, config, Stage::Gpu, target);
  TileConfig noRing = config;
  noRing.stages = 1;
  GpuCompilation plain = compileForGpu(s, noRing, target);
  AttentionSpec unmasked = s;
  unmasked.mask = MaskKind::None;
  GpuCompilation even = compileForGpu(unmasked, config, target);
  const std::string evenGpu = emitStage(unmasked, config, Stage::Gpu, target);
  persistent.emplace("FLASHJIT_PERSISTENT", nullptr);
  GpuCompilation once = compileForGpu(s, config, target);
  const std::string onceGpu = emitStage(s, config, Stage::Gpu, target);
  ASSERT_EQ(c.kernels.size(), 1u);
  ASSERT_EQ(once.kernels.size(), 1u);
  const KernelLaunch &k = c.kernels[0];
  EXPECT_TRUE(k.persistent);
  EXPECT_FALSE(once.kernels[0].persistent);
  EXPECT_FALSE(plain.kernels[0].persistent);
  EXPECT_EQ(k.threads, once.kernels[0].threads);
  EXPECT_EQ(k.sharedBytes, once.kernels[0].sharedBytes);
  const auto tiles = once.kernels[0].grid(p, s.gqaGroup);
  EXPECT_EQ(tiles[0] * tiles[1], 36);
  EXPECT_EQ(k.grid(p, s.gqaGroup, 1, 132), (std::array<int64_t, 3>{36, 1, 1}));
  EXPECT_EQ(k.grid(p, s.gqaGroup, 1, 10), (std::array<int64_t, 3>{10, 1, 1}));
  // The tile loop: unmasked, the grid's programs are its step; causal,
  // the schedule's words or the grid give its bounds and step.
  EXPECT_TRUE(k.scheduled);
  EXPECT_FALSE(once.kernels[0].scheduled);
  ASSERT_EQ(even.kernels.size(), 1u);
  EXPECT_TRUE(even.kernels[0].persistent);
  EXPECT_FALSE(even.kernels[0].scheduled);
  EXPECT_NE(gpu.find("persistent"), std::string::npos);
  EXPECT_NE(gpu.find("scheduled"), std::string::npos);
  EXPECT_NE(gpu.find("llvm.icmp \"ne\""), std::string::npos);
  EXPECT_EQ(gpu.find("step %grid_dim_x"), std::string::npos);
  EXPECT_NE(evenGpu.find("step %grid_dim_x"), std::string::npos);
  EXPECT_EQ(evenGpu.find("scheduled"), std::string::npos);
  EXPECT_EQ(onceGpu.find("persistent"), std::string::npos);
  EXPECT_EQ(onceGpu.find("step %grid_dim_x"), std::string::npos);
  // The schedule is the parameter before the tensor maps, read by both
  // roles (two bounds and a tile each).
  const std::string &ptx = c.ptx;
  const size_t firstMap = ptx.find(".param .align 64 .b8");
  ASSERT_NE(firstMap, std::string::npos);
  const size_t schedule = ptx.rfind(".param .u64 .ptr", firstMap);
  ASSERT_NE(schedule, std::string::npos);
  EXPECT_LT(ptx.find('\n', schedule), firstMap);
  EXPECT_EQ(ptx.find(".param", ptx.find('\n', schedule)), firstMap);
  size_t loads = 0;
  for (size_t at = ptx.find("ld.global.b32"); at != std::string::npos;
       at = ptx.find("ld.global.b32", at + 1))
    ++loads;
  EXPECT_EQ(loads, 6u);
}

/// The ring's forward on sm_90a copies K and V by tensor maps, and Q too
/// with FLASHJIT_TMA=qkv: it
/// records one per stream (K, then V: the buffer, seq_kv rows of the row
/// stride, the batch and head strides, the head dim's columns, a box of 64
/// columns by Bc rows), then Q's (seq_q rows, boxes of Br rows), and takes
/// them as its last parameters, 128 bytes each,
/// __grid_constant__ (read where they lie: cvta.param). With FLASHJIT_TMA=0,
/// without the ring, or with copies narrower than 16 bytes, none.
TEST(KernelLaunch, RingForwardRecordsItsTensorMaps) {
  GpuTarget target;
  target.arch = "sm_90a";
  AttentionSpec s = spec(Direction::Forward, 96, MaskKind::Causal, 2);
  TileConfig config;
  config.blockM = 128;
  config.blockN = 64;
  config.warps = 8;
  config.stages = 2;
  GpuCompilation kv = compileForGpu(s, config, target);
  ASSERT_EQ(kv.kernels.size(), 1u);
  EXPECT_EQ(kv.kernels[0].tensorMaps.size(), 2u);
  std::optional<test::ScopedEnv> tma;
  tma.emplace("FLASHJIT_TMA", "qkv");
  GpuCompilation c = compileForGpu(s, config, target);
  tma.emplace("FLASHJIT_TMA", nullptr);
  ASSERT_EQ(c.kernels.size(), 1u);
  const std::vector<TensorMapRecord> &maps = c.kernels[0].tensorMaps;
  ASSERT_EQ(maps.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    const bool isK = i == 0;
    EXPECT_EQ(maps[i].buffer, isK ? flashjit::abi::K : flashjit::abi::V);
    EXPECT_EQ(maps[i].rows, flashjit::abi::SeqKV);
    EXPECT_EQ(maps[i].rowStride,
              isK ? flashjit::abi::KStrideN : flashjit::abi::VStrideN);
    EXPECT_EQ(maps[i].outer,
              (std::vector<int>{
                  isK ? flashjit::abi::KStrideB : flashjit::abi::VStrideB,
                  isK ? flashjit::abi::KStrideH : flashjit::abi::VStrideH}));
    EXPECT_EQ(maps[i].cols, 96);
    EXPECT_EQ(maps[i].boxRows, 64);
    EXPECT_EQ(maps[i].boxCols, 64);
  }
  // Then Q's, copied by the producer too: one box of Br rows a block.
  EXPECT_EQ(maps[2].buffer, flashjit::abi::Q);
  EXPECT_EQ(maps[2].rows, flashjit::abi::SeqQ);
  EXPECT_EQ(maps[2].rowStride, flashjit::abi::QStrideN);
  EXPECT_EQ(maps[2].outer, (std::vector<int>{flashjit::abi::QStrideB,
                                             flashjit::abi::QStrideH}));
  EXPECT_EQ(maps[2].cols, 96);
  EXPECT_EQ(maps[2].boxRows, 128);
  EXPECT_NE(c.ptx.find(".param .align 64 .b8 attention_param_33[128]"),
            std::string::npos);
  EXPECT_NE(c.ptx.find("cvta.param"), std::string::npos);
  EXPECT_NE(c.ptx.find("cp.async.bulk.tensor.4d"), std::string::npos);
  EXPECT_NE(c.ptx.find("mbarrier.arrive.expect_tx"), std::string::npos);
  // The record survives the cubin cache's text.
  auto parsed = parseKernelLaunches(formatKernelLaunches(c.kernels));
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(*parsed, c.kernels);

  tma.emplace("FLASHJIT_TMA", "0");
  GpuCompilation off = compileForGpu(s, config, target);
  tma.emplace("FLASHJIT_TMA", nullptr);
  GpuTarget narrow = target;
  narrow.copyBytes = 8;
  TileConfig noRing = config;
  noRing.stages = 1;
  for (const GpuCompilation &other : {off, compileForGpu(s, config, narrow),
                                      compileForGpu(s, noRing, target)}) {
    ASSERT_EQ(other.kernels.size(), 1u);
    EXPECT_TRUE(other.kernels[0].tensorMaps.empty());
    EXPECT_EQ(other.ptx.find("cp.async.bulk.tensor"), std::string::npos);
    EXPECT_EQ(other.ptx.find("attention_param_33"), std::string::npos);
  }
}

/// A split-KV forward records two kernels: the partial over the packed
/// rows (Nq * gqa) of the KV heads with grid.z the launch's split count,
/// and the combine, a row kernel over the query rows of every head with
/// its column chunks on grid.z.
TEST(KernelLaunch, SplitForwardRecordsItsGrids) {
  GpuTarget target;
  target.arch = "sm_90a";
  Problem p = oddProblem();
  AttentionSpec s = spec(Direction::Forward, 128, MaskKind::Causal, 2);
  TileConfig config;
  config.blockM = 16;
  config.blockN = 64;
  config.warps = 1;
  config.splits = TileConfig::kAutoSplits;
  GpuCompilation c = compileForGpu(s, config, target);
  ASSERT_EQ(c.kernels.size(), 2u);
  const KernelLaunch *part = findKernelLaunch(c.kernels, kKernelName);
  const KernelLaunch *merge =
      findKernelLaunch(c.kernels, std::string(kKernelName) +
                                      flashjit::abi::split::kCombineSuffix);
  ASSERT_TRUE(part && merge);
  EXPECT_TRUE(part->kvSplit);
  auto g = part->grid(p, s.gqaGroup, 7);
  auto want = flashjit::abi::split::splitGrid(s, p, config.blockM);
  EXPECT_EQ(g[0], want[0]);
  EXPECT_EQ(g[1], want[1]);
  EXPECT_EQ(g[2], 7);
  EXPECT_EQ(part->threads, 32);
  auto m = merge->grid(p, s.gqaGroup, 7);
  EXPECT_EQ(m[0], ceilDiv(p.seqLenQ, flashjit::abi::bwd::kRowBlockRows));
  EXPECT_EQ(m[1], p.batch * p.heads);
  EXPECT_EQ(m[2], flashjit::abi::split::combineChunks(128));
  EXPECT_EQ(m[2], 4);
}

/// The backward's three records, for both dQ modes: the preprocess and
/// dq_convert over the query rows of every head, the dK/dV kernel over the
/// keys of every KV head (and, at d = 320, its column splits over grid.z),
/// the dQ pass over the query rows; threads and grids are the launcher's
/// formula's, shared memory at most the formula's.
TEST(KernelLaunch, BackwardRecordsItsGrids) {
  Problem p = oddProblem();
  for (const char *arch : {"sm_80", "sm_90a"})
    for (bool deterministic : {false, true})
      for (int64_t d : {64, 320}) {
        if (d == 320 && std::string(arch) == "sm_80")
          continue; // the column splits are the same on both targets
        AttentionSpec s =
            spec(Direction::Backward, d, MaskKind::None, 2, deterministic);
        TileConfig config = defaultGpuBackwardConfig(s);
        GpuTarget target;
        target.arch = arch;
        GpuCompilation c;
        c.kernels = gpuKernelLaunches(s, config, target);
        GpuBackwardGeometry geo = gpuBackwardGeometry(s, config);
        std::string where = std::string(arch) + " d=" + std::to_string(d) +
                            (deterministic ? " deterministic" : " atomic");
        ASSERT_EQ(c.kernels.size(), 3u) << where;
        const KernelLaunch *pre = findKernelLaunch(
            c.kernels, std::string(kKernelName) + flashjit::abi::bwd::kPreprocessSuffix);
        const KernelLaunch *main = findKernelLaunch(c.kernels, kKernelName);
        const KernelLaunch *dq = findKernelLaunch(
            c.kernels, std::string(kKernelName) + flashjit::abi::bwd::kDqSuffix);
        ASSERT_TRUE(pre && main && dq) << where;
        EXPECT_EQ(pre->grid(p, 2), geo.preprocessGrid(p)) << where;
        EXPECT_EQ(pre->threads, GpuBackwardGeometry::kPreprocessThreads);
        EXPECT_EQ(main->grid(p, 2), geo.kvGrid(p, config, 2)) << where;
        if (d == 320)
          EXPECT_GT(main->programsZ, 1) << where << ": no column split";
        EXPECT_EQ(main->threads, geo.threads) << where;
        EXPECT_LE(main->sharedBytes, geo.kvSmem.total) << where;
        EXPECT_GT(main->sharedBytes, 0) << where;
        EXPECT_EQ(dq->grid(p, 2), geo.dqGrid(p)) << where;
        EXPECT_EQ(dq->threads, geo.dqThreads()) << where;
        EXPECT_LE(dq->sharedBytes, geo.dqSharedBytes()) << where;
      }
}

/// A launcher takes only an image that records its kernel.
TEST(KernelLaunch, MissingRecordIsANamedError) {
  KernelImage image;
  image.kernels.push_back({"attention_dq", 128, 0, 64, false, false, 1});
  EXPECT_EQ(rt::recordedLaunch(image, "attention_dq").rows, 64);
  try {
    rt::recordedLaunch(image, "attention");
    FAIL() << "no error";
  } catch (const rt::RuntimeError &e) {
    EXPECT_EQ(e.code(), rt::ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'attention'"), std::string::npos)
        << e.what();
  }
}

/// The cubin cache stores the records with the cubin, and whether its PTX
/// wants whole-program assembly (CubinBuild::wholeProgram); an entry of a
/// format before them (no records; no `whole=`), or with a damaged record,
/// is rebuilt with them.
TEST(KernelLaunch, CubinCacheKeepsTheRecords) {
  std::string dir =
      (std::filesystem::temp_directory_path() /
       ("flashjit-launch-test-" + std::to_string(std::random_device{}())))
          .string();
  rt::DiskCache cache(dir);
  AttentionSpec s = spec(Direction::Backward, 64, MaskKind::None, 1);
  TileConfig config = defaultGpuBackwardConfig(s);
  GpuTarget target;
  target.arch = "sm_80";
  engine::CubinBuild first = engine::buildCubin(s, config, target, cache);
  EXPECT_EQ(first.cache, rt::CacheStatus::Miss);
  ASSERT_EQ(first.image.kernels.size(), 3u);
  engine::CubinBuild again = engine::buildCubin(s, config, target, cache);
  EXPECT_EQ(again.cache, rt::CacheStatus::Hit);
  EXPECT_EQ(again.image.kernels, first.image.kernels);
  EXPECT_EQ(again.image.cubin, first.image.cubin);
  EXPECT_FALSE(first.wholeProgram);
  EXPECT_FALSE(again.wholeProgram);

  rt::CacheKey key = engine::cubinKey(s, config, target);
  std::string old = "registers=255 spill=0\n";
  std::string noWhole = "registers=255 spill=0 kernels=3\n" +
                        formatKernelLaunches(first.image.kernels);
  std::string damaged = "registers=255 spill=0 whole=0 kernels=3\n" +
                        formatKernelLaunches(first.image.kernels);
  damaged.replace(damaged.find(" keys "), 6, " rows ");
  for (const std::string &head : {old, noWhole, damaged}) {
    std::vector<char> payload(head.begin(), head.end());
    payload.insert(payload.end(), first.image.cubin.begin(),
                   first.image.cubin.end());
    ASSERT_TRUE(cache.store("cubin", key, payload));
    engine::CubinBuild rebuilt = engine::buildCubin(s, config, target, cache);
    EXPECT_EQ(rebuilt.cache, rt::CacheStatus::Rebuilt) << head;
    EXPECT_EQ(rebuilt.image.kernels, first.image.kernels) << head;
  }

  // A warpgroup kernel on the K/V ring (sm_90a): its PTX wants the whole
  // program, a fact the cache keeps.
  AttentionSpec hopper = spec(Direction::Forward, 128, MaskKind::None, 1);
  GpuTarget sm90a;
  sm90a.arch = "sm_90a";
  TileConfig ring = defaultGpuConfig(hopper, true, true);
  engine::CubinBuild built = engine::buildCubin(hopper, ring, sm90a, cache, {},
                                                engine::Assembler::Cubin);
  EXPECT_EQ(built.cache, rt::CacheStatus::Miss);
  EXPECT_TRUE(built.wholeProgram);
  engine::CubinBuild kept = engine::buildCubin(hopper, ring, sm90a, cache, {},
                                               engine::Assembler::Cubin);
  EXPECT_EQ(kept.cache, rt::CacheStatus::Hit);
  EXPECT_TRUE(kept.wholeProgram);
  std::filesystem::remove_all(dir);
}

} // namespace

// The packed argument buffer (FLASHJIT_PACKED_LAUNCH=1): the forward's list
// as the PTX declares it (9 .u64 pointers, 23 .u64 indices, one .f32, two
// `.align 64 .b8 [128]` tensor maps) in order, each at its alignment.
TEST(PackedParams, LayOutTheForwardsArgumentsAsThePtxDeclaresThem) {
  rt::PackedParams p = rt::packParams(
      {{9, 8, 8}, {23, 8, 8}, {1, 4, 4}, {0, 8, 8}, {2, 128, 64}});
  ASSERT_EQ(p.offsets.size(), 35u);
  ASSERT_EQ(p.sizes.size(), 35u);
  EXPECT_EQ(p.offsets[0], 0u);
  EXPECT_EQ(p.offsets[8], 64u);
  EXPECT_EQ(p.offsets[31], 248u); // the last index
  EXPECT_EQ(p.offsets[32], 256u); // scale * log2(e)
  EXPECT_EQ(p.sizes[32], 4u);
  EXPECT_EQ(p.offsets[33], 320u); // 260 rounded up to 64
  EXPECT_EQ(p.offsets[34], 448u);
  EXPECT_EQ(p.sizes[34], 128u);
  EXPECT_EQ(p.bytes, 576u);
  // A captured tensor after the f32 starts at the next multiple of 8.
  rt::PackedParams c = rt::packParams({{1, 4, 4}, {1, 8, 8}});
  EXPECT_EQ(c.offsets[1], 8u);
  EXPECT_EQ(c.bytes, 16u);
}

namespace {
/// The .param declarations of the PTX's `.entry attention(` laid out at
/// their declared alignments (a .f32 4, a `.align 64 .b8 [128]` tensor map
/// 64, any other 8): the offsets and sizes, and how many maps.
struct DeclaredParams {
  std::vector<unsigned> offsets, sizes;
  unsigned bytes = 0, maps = 0;
};
DeclaredParams declaredParams(const std::string &ptx) {
  DeclaredParams d;
  const size_t entry = ptx.find(".entry attention(");
  if (entry == std::string::npos)
    return d;
  std::istringstream lines(ptx.substr(entry, ptx.find(')', entry) - entry));
  for (std::string line; std::getline(lines, line);) {
    if (line.find(".param") == std::string::npos)
      continue;
    unsigned size = 8, align = 8;
    if (line.find(".f32") != std::string::npos) {
      size = align = 4;
    } else if (line.find(".align 64 .b8") != std::string::npos &&
               line.find("[128]") != std::string::npos) {
      size = 128;
      align = 64;
      ++d.maps;
    }
    d.bytes = (d.bytes + align - 1) / align * align;
    d.offsets.push_back(d.bytes);
    d.sizes.push_back(size);
    d.bytes += size;
  }
  return d;
}
} // namespace

// ... and the launcher's list is the kernel's: the .param declarations of a
// compiled forward with two tensor maps (d = 128, 128 x 128, 8 warps: K and
// V by TMA) and of a split-KV forward (its partials' two buffers and the
// split count) are where packForwardArguments puts the arguments.
TEST(PackedParams, TheForwardsListIsTheCompiledKernels) {
  GpuTarget target;
  target.arch = "sm_90a";
  AttentionSpec s = spec(Direction::Forward, 128, MaskKind::None, 1);
  TileConfig config;
  config.blockM = config.blockN = 128;
  config.warps = 8;
  DeclaredParams d = declaredParams(emitStage(s, config, Stage::Ptx, target));
  ASSERT_EQ(d.maps, 2u);
  rt::PackedParams p = rt::packForwardArguments(false, 0, int(d.maps));
  EXPECT_EQ(p.offsets, d.offsets);
  EXPECT_EQ(p.sizes, d.sizes);
  EXPECT_EQ(p.bytes, d.bytes);

  TileConfig split = defaultGpuConfig(s);
  split.splits = 4;
  DeclaredParams ds = declaredParams(emitStage(s, split, Stage::Ptx, target));
  ASSERT_FALSE(ds.offsets.empty());
  rt::PackedParams ps = rt::packForwardArguments(true, 0, int(ds.maps));
  EXPECT_EQ(ps.offsets, ds.offsets);
  EXPECT_EQ(ps.sizes, ds.sizes);

  // A scheduled (causal persistent) forward: its schedule before the maps.
  AttentionSpec causal = s;
  causal.mask = MaskKind::Causal;
  TileConfig persistent = config;
  persistent.persistent = persistent.queryByTensorMap = true;
  DeclaredParams dc =
      declaredParams(emitStage(causal, persistent, Stage::Ptx, target));
  ASSERT_EQ(dc.maps, 3u);
  rt::PackedParams pc =
      rt::packForwardArguments(false, 0, int(dc.maps), /*scheduled=*/true);
  EXPECT_EQ(pc.offsets, dc.offsets);
  EXPECT_EQ(pc.sizes, dc.sizes);
  EXPECT_EQ(pc.bytes, dc.bytes);
  EXPECT_NE(rt::packForwardArguments(false, 0, int(dc.maps)).offsets,
            dc.offsets);
}
