//===- GpuCodegenTests.cpp - The GPU kernel matrix assembles, spill-free --===//
//
/// \file
/// CI has no GPU, so this is where every push checks the GPU lowering end to
/// end short of running it: for a matrix of specs (head dims incl. 33, 80,
/// 96, 100, 160, 256, 512; dqk != dv; masks; bf16/fp16; block-sparse) and
/// tile configs, the PTX assembles for sm_80 and sm_90a through nvJitLink,
/// and for dv <= 256 the default config spills nothing and fits the H200's
/// shared memory; the backward's default configs assemble too, within
/// bounds on spills.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/GpuDefaults.h"
#include "kernels/GpuGeometry.h"
#include "runtime/NvJitLink.h"
#include "tests/unit/AttentionCases.h"
#include "tests/unit/runtime/ScopedEnv.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <unistd.h>

using namespace flashjit;
using flashjit::test::tileConfig;

namespace {

struct GpuCase {
  int64_t dqk, dv;
  DType dtype;
  MaskKind mask;
  bool sparse;

  AttentionSpec spec(Direction direction) const {
    AttentionSpec s;
    s.headDimQK = dqk;
    s.headDimV = dv;
    s.dtype = dtype;
    s.mask = mask;
    s.blockSparse = sparse;
    s.direction = direction;
    return s;
  }
};

/// The cubin of \p spec with \p config for \p arch, through nvJitLink.
/// A driver whose PTX ISA (8.1 or later) lets sm_90 kernels use vector
/// reductions (usesVectorAtomics).
constexpr int kRecentDriver = 12080;

/// The CUDA toolkit's ptxas ($CUDA_HOME/bin, /usr/local/cuda/bin), or "".
std::string findPtxas() {
  const char *home = std::getenv("CUDA_HOME");
  for (const std::string &dir :
       {std::string(home ? home : ""), std::string("/usr/local/cuda")})
    if (!dir.empty() && access((dir + "/bin/ptxas").c_str(), X_OK) == 0)
      return dir + "/bin/ptxas";
  return "";
}

/// ptxas's verbose report of \p ptx compiled as a whole program, as the
/// driver's JIT compiles the kernels that want it (setmaxnreg, which
/// nvJitLink's separate compilation ignores: C7504).
std::string wholeProgramReport(const std::string &ptx, const char *arch) {
  const std::string ptxas = findPtxas();
  if (ptxas.empty()) {
    ADD_FAILURE() << "a kernel with setmaxnreg needs the CUDA toolkit's "
                     "ptxas for its whole-program report";
    return "";
  }
  char path[] = "/tmp/flashjit-ptx-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) {
    ADD_FAILURE() << "mkstemp failed";
    return "";
  }
  close(fd);
  std::ofstream(path) << ptx;
  std::string cmd =
      ptxas + " -arch=" + arch + " -v -o /dev/null " + path + " 2>&1";
  std::string out;
  if (FILE *p = popen(cmd.c_str(), "r")) {
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0)
      out.append(buf.data(), n);
    EXPECT_EQ(pclose(p), 0) << out;
  }
  std::remove(path);
  return out;
}

/// The cubin of \p config by nvJitLink; its info log is ptxas's whole-
/// program report for a kernel that moves registers (setmaxnreg).
rt::CubinResult assemble(const AttentionSpec &spec, const TileConfig &config,
                         const char *arch, int driverVersion = 0) {
  GpuTarget target;
  target.arch = arch;
  target.driverVersion = driverVersion;
  const std::string ptx = compileToPtx(spec, config, target);
  rt::CubinResult cubin = rt::ptxToCubin(ptx, arch);
  EXPECT_GT(cubin.cubin.size(), 4u);
  if (cubin.cubin.size() > 4)
    EXPECT_EQ(std::string(cubin.cubin.data() + 1, 3), "ELF");
  if (ptx.find("setmaxnreg") != std::string::npos)
    cubin.infoLog = wholeProgramReport(ptx, arch);
  return cubin;
}

std::string caseName(const GpuCase &c) {
  return "dqk" + std::to_string(c.dqk) + "_dv" + std::to_string(c.dv) +
         (c.dtype == DType::BF16 ? "_bf16" : "_fp16") + "_" + toString(c.mask) +
         (c.sparse ? "_sparse" : "");
}

class GpuCodegen : public ::testing::TestWithParam<GpuCase> {
protected:
  void SetUp() override {
    if (!rt::NvJitLink::get().available())
      GTEST_SKIP() << "skipped: no nvJitLink";
  }
};

/// The default tiling of each target (the warpgroup one on sm_90a, which
/// the lowering must then place on wgmma) assembles within the shared
/// memory and, up to dv = 256 on sm_90a, without spills.
TEST_P(GpuCodegen, DefaultConfigAssemblesWithoutSpills) {
  const GpuCase &c = GetParam();
  AttentionSpec spec = c.spec(Direction::Forward);
  for (const char *arch : {"sm_80", "sm_90a"}) {
    GpuTarget target;
    target.arch = arch;
    TileConfig config =
        defaultGpuConfig(spec, usesWgmma(target), usesKvRing(target));
    if (usesWgmma(target) && std::max(c.dqk, c.dv) <= 256 &&
        !spec.blockSparse) {
      EXPECT_TRUE(gpuGeometry(spec, config, usesKvRing(target)).wgmmaShape)
          << config.toJson();

      EXPECT_NE(compileToPtx(spec, config, target).find("wgmma.mma_async"),
                std::string::npos)
          << config.toJson();
    }
    rt::CubinResult cubin = assemble(spec, config, arch);
    rt::ResourceUsage use = rt::parseResourceUsage(cubin.infoLog);
    EXPECT_GT(use.registers, 0) << cubin.infoLog;
    int64_t shared = gpuGeometry(spec, config, usesKvRing(target)).sharedBytes +
                     use.sharedBytes;
    EXPECT_LE(shared, 227 * 1024) << arch;
    if (c.dv <= 256 && std::string(arch) == "sm_90a")
      EXPECT_EQ(use.spills(), 0)
          << "default config " << config.toJson() << " spills\n"
          << cubin.infoLog;
  }
}

/// Whether the gpu stage \p gpu records \p geo's shared memory and threads.
/// With Q by its tensor map (the ring's, 16-byte copies) O's own staging
/// slot comes on top (queryMapSharedBytes).
void expectRecords(const std::string &gpu, const GpuGeometry &geo,
                   const TileConfig &config) {
  const int64_t shared = geo.ringStages && config.queryByTensorMap
                             ? queryMapSharedBytes(geo, config)
                             : geo.sharedBytes;
  EXPECT_NE(
      gpu.find("attn.shared_bytes = " + std::to_string(shared) + " : i64"),
      std::string::npos)
      << config.toJson() << " does not record " << shared;
  EXPECT_NE(gpu.find("known_block_size = array<i32: " +
                     std::to_string(geo.threads) + ", 1, 1>"),
            std::string::npos)
      << config.toJson();
}

/// The forward kernel's recorded resources (attn.shared_bytes, the block
/// size) are what the launcher provides (kernels/GpuGeometry.h): the tile
/// lowering's slots must fit the launcher's formula, for every case of the
/// matrix at its default tiling and at a second one, on sm_90a with the
/// K/V ring where the tiling takes it (usesKvRing, as the launcher).
TEST_P(GpuCodegen, RecordedResourcesMatchTheLauncher) {
  const GpuCase &c = GetParam();
  AttentionSpec spec = c.spec(Direction::Forward);
  GpuTarget target;
  target.arch = "sm_90a";
  for (TileConfig config : {defaultGpuConfig(spec), tileConfig(64, 32, 4),
                            defaultGpuConfig(spec, true)}) {
    if (spec.blockSparse && (spec.sparseBlock % config.blockM != 0 ||
                             spec.sparseBlock % config.blockN != 0))
      continue;
    std::string gpu = emitStage(spec, config, Stage::Gpu, target);
    GpuGeometry geo = gpuGeometry(spec, config, usesKvRing(target));
    expectRecords(gpu, geo, config);
  }
}

/// Sets FLASHJIT_KV_RING=1 for its lifetime (the K/V ring is opt-in).
struct KvRingOn {
  test::ScopedEnv ring{"FLASHJIT_KV_RING", "1"};
};

/// With the K/V ring (FLASHJIT_KV_RING=1, sm_90a), the forward records the
/// launcher's resources (Q, the stages and their barriers; the consumers
/// and the producer warpgroup) for the ring's default tiling, 3 stages,
/// none, and one warpgroup (no ring: the ring takes 8 or 12 warps and
/// head dims up to 256, takesKvRing); its barriers are there exactly when
/// the geometry has a ring; and the ring's default tiling assembles without
/// spills up to d = 256.
TEST_P(GpuCodegen, KvRingRecordsTheLaunchersResources) {
  const GpuCase &c = GetParam();
  AttentionSpec spec = c.spec(Direction::Forward);
  KvRingOn ring;
  GpuTarget target;
  target.arch = "sm_90a";
  ASSERT_TRUE(usesKvRing(target));
  TileConfig ring3 = tileConfig(128, 64, 8), none = tileConfig(128, 64, 8),
             oneGroup = tileConfig(64, 64, 4);
  ring3.stages = 3;
  none.stages = 1;
  const TileConfig ringDefault = defaultGpuConfig(spec, true, true);
  for (const TileConfig &config : {ringDefault, ring3, none, oneGroup}) {
    if (spec.blockSparse && (spec.sparseBlock % config.blockM != 0 ||
                             spec.sparseBlock % config.blockN != 0))
      continue;
    if (!gpuConfigProblem(spec, config, 227 * 1024, true).empty())
      continue;
    std::string gpu = emitStage(spec, config, Stage::Gpu, target);
    GpuGeometry geo = gpuGeometry(spec, config, true);
    const bool ringShape = geo.wgmmaShape && takesKvRing(spec, config, true);
    EXPECT_EQ(geo.ringStages,
              ringShape && config.stages > 1 ? config.stages : 0)
        << config.toJson();
    expectRecords(gpu, geo, config);
    EXPECT_EQ(gpu.find("mbarrier.try_wait.parity") != std::string::npos,
              geo.ringStages > 0)
        << config.toJson();
  }
  if (std::max(c.dqk, c.dv) <= 256) {
    rt::ResourceUsage use =
        rt::parseResourceUsage(assemble(spec, ringDefault, "sm_90a").infoLog);
    EXPECT_EQ(use.spills(), 0) << ringDefault.toJson() << " spills";
  }
}

/// The backward kernels' recorded resources fit what the launcher provides
/// (gpuBackwardGeometry): the shared memory a kernel records is at most the
/// launcher's (equal, but for the shapes warpgroup MMAs can take, where the
/// launcher's formula pads and counts a P^T tile), the block size is the
/// launcher's; for both dQ modes, on sm_90a and sm_80.
TEST_P(GpuCodegen, RecordedBackwardResourcesMatchTheLauncher) {
  const GpuCase &c = GetParam();
  for (bool deterministic : {false, true})
    for (const char *arch : {"sm_80", "sm_90a"}) {
      AttentionSpec spec = c.spec(Direction::Backward);
      spec.deterministic = deterministic;
      TileConfig config = defaultGpuBackwardConfig(spec);
      GpuTarget target;
      target.arch = arch;
      std::string gpu = emitStage(spec, config, Stage::Gpu, target);
      GpuBackwardGeometry geo = gpuBackwardGeometry(spec, config);
      auto recorded = [&](const std::string &fn, int64_t shared,
                          int64_t threads, bool exact) {
        size_t at = gpu.find("gpu.func @" + fn + "(");
        ASSERT_NE(at, std::string::npos) << fn;
        std::string head = gpu.substr(at, gpu.find("{\n", at) - at);
        const std::string key = "attn.shared_bytes = ";
        size_t k = head.find(key);
        ASSERT_NE(k, std::string::npos) << fn << ": " << head;
        int64_t bytes = std::stoll(head.substr(k + key.size()));
        std::string where = fn + " " + config.toJson() + " " + arch;
        EXPECT_LE(bytes, shared) << where;
        if (exact)
          EXPECT_EQ(bytes, shared) << where;
        EXPECT_NE(head.find("known_block_size = array<i32: " +
                            std::to_string(threads) + ", 1, 1>"),
                  std::string::npos)
            << where << ": " << head;
      };
      recorded("attention_preprocess", 0,
               GpuBackwardGeometry::kPreprocessThreads, true);
      // A shape that wgmma could take pads the launcher's statistics to
      // 1 KiB on every target.
      // Split columns: the launcher sizes every slot for the widest chunk
      // set, the lowering only the slots read as product columns.
      // Warpgroup MMAs take a third stage of Q and dO where it fits (the
      // default since T41): then the kernel records exactly its bytes.
      if (gpu.find("wgmma.mma_async") != std::string::npos &&
          geo.kvThreeStageBytes(false) <= kSm90MaxSharedBytes)
        recorded("attention", geo.kvThreeStageBytes(false), geo.threads, true);
      else
        recorded("attention", geo.kvSmem.total, geo.threads,
                 !geo.wgmmaShape && geo.kvCombined);
      recorded("attention_dq", geo.dqSharedBytes(), geo.dqThreads(),
               geo.dqChunks == 1);
    }
}

/// The backward's three kernels at their default tiling assemble, fit the
/// H200's shared memory and registers, and spill at most a few bytes: the
/// defaults are the fastest tilings measured (bench/NOTES.md), some of which
/// spill a few bytes in one kernel (masked d = 128, d = 256, d = 512); a
/// spill past the bounds below is a regression of the lowering's register
/// use.
TEST_P(GpuCodegen, DefaultBackwardConfigAssembles) {
  const GpuCase &c = GetParam();
  // Atomic dQ (the default) for sm_80 (scalar reductions) and for sm_90a
  // with a recent driver (vector reductions); the separate dQ pass for
  // sm_90a.
  for (auto [deterministic, arch, driver] :
       {std::tuple(false, "sm_80", 0),
        std::tuple(false, "sm_90a", kRecentDriver),
        std::tuple(true, "sm_90a", 0)}) {
    AttentionSpec spec = c.spec(Direction::Backward);
    spec.deterministic = deterministic;
    TileConfig config = defaultGpuBackwardConfig(spec);
    GpuBackwardGeometry geo = gpuBackwardGeometry(spec, config);
    EXPECT_LE(std::max(geo.kvSmem.total, geo.dqSharedBytes()), 227 * 1024);
    const int64_t d = std::max(c.dqk, c.dv);
    // Measured: the separate pass at most 28 bytes up to d = 128 and 100
    // at d = 256 (causal, block-sparse, fp16); atomic dQ 104 for masked
    // d = 128 (172 block-sparse fp16) and 180 at d = 256 (sm_80); 128 at
    // d = 512.
    const int spillBound = deterministic ? (d <= 128   ? 64
                                            : d <= 256 ? 128
                                                       : 512)
                                         : (d <= 256 ? 192 : 512);
    rt::CubinResult cubin = assemble(spec, config, arch, driver);
    for (const char *fn :
         {"attention_preprocess", "attention", "attention_dq"}) {
      rt::ResourceUsage use = rt::parseResourceUsage(cubin.infoLog, fn);
      EXPECT_GT(use.registers, 0) << fn << "\n" << cubin.infoLog;
      EXPECT_LE(use.registers, 255) << fn;
      EXPECT_LE(use.spillStoresBytes, spillBound)
          << fn << " with " << config.toJson() << " on " << arch << "\n"
          << cubin.infoLog;
    }
    // The reductions the target allows, and only with atomic dQ.
    std::string ptx = [&] {
      GpuTarget t;
      t.arch = arch;
      t.driverVersion = driver;
      return compileToPtx(spec, config, t);
    }();
    EXPECT_EQ(ptx.find("red.global.add.f32") != std::string::npos,
              !deterministic && (driver == 0 || c.dqk % 2 != 0))
        << arch;
    EXPECT_EQ(ptx.find("red.global.add.v2.f32") != std::string::npos,
              !deterministic && driver != 0 && c.dqk % 2 == 0)
        << arch;
  }
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(Matrix, GpuCodegen, ::testing::Values(
  GpuCase{1, 1, DType::BF16, MaskKind::None, false},
  GpuCase{33, 33, DType::BF16, MaskKind::Causal, false},
  GpuCase{64, 64, DType::FP16, MaskKind::None, false},
  GpuCase{80, 80, DType::BF16, MaskKind::SlidingWindow, false},
  GpuCase{96, 96, DType::BF16, MaskKind::Causal, false},
  GpuCase{100, 100, DType::FP16, MaskKind::None, false},
  GpuCase{128, 128, DType::BF16, MaskKind::None, false},
  GpuCase{128, 128, DType::FP16, MaskKind::Causal, true},
  GpuCase{32, 32, DType::BF16, MaskKind::Causal, false},
  GpuCase{88, 88, DType::BF16, MaskKind::Causal, false},
  GpuCase{128, 128, DType::BF16, MaskKind::SlidingWindow, false},
  GpuCase{256, 256, DType::FP16, MaskKind::Causal, true},
  GpuCase{160, 128, DType::BF16, MaskKind::Causal, false},
  GpuCase{64, 256, DType::BF16, MaskKind::None, false},
  GpuCase{256, 256, DType::BF16, MaskKind::SlidingWindow, false},
  GpuCase{512, 512, DType::BF16, MaskKind::None, false},
  GpuCase{300, 400, DType::FP16, MaskKind::Causal, false}),
  [](const auto &info) { return caseName(info.param); });
// clang-format on

/// Non-default tiles and copy widths (odd head dims give 2-byte rows).
TEST(GpuCodegenConfigs, TilesAndCopyWidthsAssemble) {
  if (!rt::NvJitLink::get().available())
    GTEST_SKIP() << "skipped: no nvJitLink";
  AttentionSpec spec;
  spec.headDimQK = 33;
  spec.headDimV = 40;
  for (int64_t copy : {2, 4, 8, 16})
    for (auto [bm, bn, w] :
         {std::array<int64_t, 3>{64, 32, 4}, std::array<int64_t, 3>{128, 64, 8},
          std::array<int64_t, 3>{16, 16, 1}}) {
      TileConfig config = tileConfig(bm, bn, w);
      GpuTarget target;
      target.copyBytes = copy;
      std::string ptx = compileToPtx(spec, config, target);
      EXPECT_NO_THROW(rt::ptxToCubin(ptx, "sm_90a"))
          << "copy " << copy << " tile " << config.toJson();
    }
}

/// The score modifiers reach the GPU kernel with no lowering of their own
/// (the region is elementwise tile IR): at d = 128 on the default tilings
/// of sm_90a (on wgmma) and sm_80, plain and causal, the PTX holds the
/// modifier's instructions (softcap's tanh.approx, ALiBi's i32 -> f32
/// conversion of kv_idx - q_idx) and assembles. Spills on sm_90a (of the
/// whole program, as the driver's JIT compiles a kernel with setmaxnreg):
/// none, on the overlapped loop that d = 128 takes with a modifier (T30;
/// the plain loop's ALiBi spilled up to 64 bytes); sm_80 is not bounded, as
/// in the matrix (softcap spills there: 1-2.5 KB at 128 x 64 and 128 x 32).
TEST(GpuCodegenConfigs, ScoreModsAssemble) {
  if (!rt::NvJitLink::get().available())
    GTEST_SKIP() << "skipped: no nvJitLink";
  for (const char *mod : {"softcap:20", "alibi:8"})
    for (MaskKind mask : {MaskKind::None, MaskKind::Causal})
      for (const char *arch : {"sm_90a", "sm_80"}) {
        AttentionSpec spec;
        spec.mask = mask;
        spec.scoreMod = mod;
        GpuTarget target;
        target.arch = arch;
        TileConfig config =
            defaultGpuConfig(spec, usesWgmma(target), usesKvRing(target));
        SCOPED_TRACE(spec.name() + " " + config.toJson() + " " + arch);
        std::string ptx = compileToPtx(spec, config, target);
        EXPECT_EQ(ptx.find("wgmma.mma_async") != std::string::npos,
                  usesWgmma(target));
        const bool softcap = std::string(mod).rfind("softcap", 0) == 0;
        EXPECT_NE(ptx.find(softcap ? "tanh.approx.f32" : "cvt.rn.f32.s32"),
                  std::string::npos);
        rt::CubinResult cubin = rt::ptxToCubin(ptx, arch);
        if (ptx.find("setmaxnreg") != std::string::npos)
          cubin.infoLog = wholeProgramReport(ptx, arch); // as the driver's
        rt::ResourceUsage use = rt::parseResourceUsage(cubin.infoLog);
        EXPECT_GT(use.registers, 0) << cubin.infoLog;
        if (usesWgmma(target)) {
          EXPECT_EQ(use.spillStoresBytes, 0) << cubin.infoLog;
          EXPECT_EQ(use.spillLoadsBytes, 0) << cubin.infoLog;
        }
      }
}

/// Atomic dQ's warp splits of dS K (4 pieces of a 64-column group per
/// group with 4 or 8 warps, 2 with 2, 1 with 1; 8 warps take the groups in
/// two phases), odd and even head dims (scalar or vector reductions): they
/// assemble, and reduce into dq_accum.
TEST(GpuCodegenConfigs, AtomicDqWarpSplitsAssemble) {
  if (!rt::NvJitLink::get().available())
    GTEST_SKIP() << "skipped: no nvJitLink";
  for (auto [dqk, dv] : {std::pair<int64_t, int64_t>{33, 40}, {192, 64}})
    for (auto [bm, bn, w] :
         {std::array<int64_t, 3>{64, 128, 8}, std::array<int64_t, 3>{32, 64, 2},
          std::array<int64_t, 3>{16, 16, 1}}) {
      AttentionSpec spec;
      spec.direction = Direction::Backward;
      spec.headDimQK = dqk;
      spec.headDimV = dv;
      spec.mask = MaskKind::Causal;
      TileConfig config = tileConfig(bm, bn, w);
      GpuTarget target;
      target.driverVersion = kRecentDriver;
      std::string ptx = compileToPtx(spec, config, target);
      EXPECT_NE(
          ptx.find(dqk % 2 ? "red.global.add.f32" : "red.global.add.v2.f32"),
          std::string::npos)
          << dqk << " " << config.toJson();
      EXPECT_NO_THROW(rt::ptxToCubin(ptx, "sm_90a")) << config.toJson();
    }
}

/// The dK/dV kernel runs on warpgroup MMAs exactly where it can: sm_90a,
/// atomic dQ and GpuBackwardGeometry::wgmmaShape (one and two warpgroups,
/// dQ split over columns or keys, masks, fp16); those kernels assemble
/// with at most a few bytes of spill (measured: 0-12). Elsewhere (sm_90,
/// the separate dQ pass, d = 96, Br = 128) it stays on mma.sync.
TEST(GpuCodegenConfigs, WgmmaWhereTheShapeAllows) {
  if (!rt::NvJitLink::get().available())
    GTEST_SKIP() << "skipped: no nvJitLink";
  struct Case {
    int64_t dqk, dv;
    MaskKind mask;
    DType dtype;
    bool deterministic;
    TileConfig config;
    const char *arch;
    bool wgmma;
  };
  const Case cases[] = {
      {128, 128, MaskKind::None, DType::BF16, false, tileConfig(64, 128, 8),
       "sm_90a", true},
      {128, 128, MaskKind::Causal, DType::FP16, false, tileConfig(64, 64, 4),
       "sm_90a", true},
      {64, 128, MaskKind::SlidingWindow, DType::BF16, false,
       tileConfig(64, 128, 8), "sm_90a", true},
      {128, 128, MaskKind::None, DType::BF16, false, tileConfig(64, 128, 8),
       "sm_90", false},
      {128, 128, MaskKind::None, DType::BF16, true, tileConfig(64, 64, 4),
       "sm_90a", false},
      {96, 96, MaskKind::Causal, DType::BF16, false, tileConfig(64, 128, 8),
       "sm_90a", true},
      {33, 80, MaskKind::None, DType::FP16, false, tileConfig(64, 64, 4),
       "sm_90a", true},
      {256, 256, MaskKind::None, DType::BF16, false, tileConfig(64, 64, 4),
       "sm_90a", false},
      {128, 128, MaskKind::None, DType::BF16, false, tileConfig(64, 128, 4),
       "sm_90a", false},
      {64, 64, MaskKind::None, DType::BF16, false, tileConfig(128, 128, 8),
       "sm_90a", false},
  };
  for (const Case &c : cases) {
    AttentionSpec spec;
    spec.direction = Direction::Backward;
    spec.headDimQK = c.dqk;
    spec.headDimV = c.dv;
    spec.mask = c.mask;
    spec.dtype = c.dtype;
    spec.deterministic = c.deterministic;
    GpuTarget target;
    target.arch = c.arch;
    target.driverVersion = kRecentDriver;
    EXPECT_EQ(usesWgmma(target) &&
                  gpuBackwardGeometry(spec, c.config).wgmmaShape,
              c.wgmma);
    std::string ptx = compileToPtx(spec, c.config, target);
    SCOPED_TRACE(spec.name() + " " + c.config.toJson() + " " + c.arch);
    EXPECT_EQ(ptx.find("wgmma.mma_async") != std::string::npos, c.wgmma);
    EXPECT_EQ(gpuPipelineText(c.config, target).find("wgmma=true") !=
                  std::string::npos,
              std::string(c.arch) == "sm_90a");
    if (!c.wgmma)
      continue;
    rt::CubinResult cubin = rt::ptxToCubin(ptx, c.arch);
    rt::ResourceUsage use = rt::parseResourceUsage(cubin.infoLog, "attention");
    EXPECT_GT(use.registers, 0) << cubin.infoLog;
    EXPECT_LE(use.spillStoresBytes, 64) << cubin.infoLog;
  }
}

/// The backward's narrow copies at d > 256 (8 bytes: rows of 600 and 800
/// bytes), both dQ modes: they assemble. They spill (measured: 760-812
/// bytes; 4.1-5.0 KB with 2-byte copies, not compiled here for time: the
/// unrolled copies' addresses; a known cost, bench/NOTES.md); the bound
/// catches a regression past that.
TEST(GpuCodegenConfigs, BackwardNarrowCopiesAssemble) {
  if (!rt::NvJitLink::get().available())
    GTEST_SKIP() << "skipped: no nvJitLink";
  for (bool deterministic : {false, true})
    for (int64_t copy : {8}) {
      AttentionSpec spec;
      spec.direction = Direction::Backward;
      spec.headDimQK = 300;
      spec.headDimV = 400;
      spec.blockSparse = true;
      spec.sparseBlock = 32;
      spec.deterministic = deterministic;
      TileConfig config = defaultGpuBackwardConfig(spec);
      GpuTarget target;
      target.copyBytes = copy;
      rt::CubinResult cubin =
          rt::ptxToCubin(compileToPtx(spec, config, target), "sm_90a");
      rt::ResourceUsage use =
          rt::parseResourceUsage(cubin.infoLog, "attention");
      EXPECT_LE(use.spillStoresBytes, 1024)
          << "deterministic " << deterministic << " copy " << copy << "\n"
          << cubin.infoLog;
    }
}

TEST(GpuCodegenConfigs, ImpossibleRequestsAreNamedErrors) {
  AttentionSpec spec;
  TileConfig config;
  config.blockM = 48;
  config.warps = 4;
  EXPECT_THROW(compileToPtx(spec, config, {}), SpecError);
  config = defaultGpuConfig(spec);
  GpuTarget target;
  target.arch = "sm_75";
  EXPECT_THROW(compileToPtx(spec, config, target), CompileError);
  target.arch = "sm_90a";
  target.copyBytes = 3;
  EXPECT_THROW(compileToPtx(spec, config, target), SpecError);
}

} // namespace
