//===- VarlenGpuTests.cpp - Variable-length batches on the GPU vs float64 -===//
//
/// \file
/// Variable-length packing (AttentionSpec::varlen) on the GPU through
/// `flashjit run --device cuda --seqlens-q ... --json`: fresh random
/// token-major inputs, NaN-poisoned outputs, and every sequence checked
/// against the float64 reference of that sequence alone (kernels/Varlen.h),
/// so a leak across a boundary or a wrong offset fails. Forward: the
/// sm_90a default (the K/V ring; its copies by cp.async, since a sequence's
/// rows are no tensor map's), warpgroup MMAs without the ring, mma.sync
/// tilings, the pipelined loop, split-KV decode with GQA packing; masks,
/// GQA, dqk != dv, fp16, sequences without queries or keys. Backward: both
/// dQ modes. Skipped, and shown as skipped, without a driver.
//
//===----------------------------------------------------------------------===//

#include "runtime/CudaDriver.h"
#include "tests/gpu/CliRunner.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>

namespace {

using flashjit::test::jsonNumber;
using flashjit::test::runFlashjit;

/// The flags of a case and the environment it runs under.
using VarlenCase = std::tuple<const char *, const char *>;

class VarlenGpu : public ::testing::TestWithParam<VarlenCase> {
protected:
  void SetUp() override {
    if (!flashjit::rt::CudaDriver::get().available())
      GTEST_SKIP() << "skipped: no CUDA driver";
  }
  /// Runs `run --device cuda --json` + \p args under \p env and checks it.
  std::string runAndCheck(const std::string &args, const std::string &env) {
    auto r = runFlashjit("run --device cuda --json " + args, env);
    SCOPED_TRACE(env + " flashjit run --device cuda --json " + args + "\n" +
                 r.out);
    EXPECT_EQ(r.exitCode, 0);
    EXPECT_NE(r.out.find("\"ok\":true"), std::string::npos);
    EXPECT_NE(r.out.find("\"varlen\":true"), std::string::npos);
    EXPECT_LT(jsonNumber(r.out, "rel_err"), jsonNumber(r.out, "bound"));
    EXPECT_EQ(jsonNumber(r.out, "nan_count"), 0);
    return r.out;
  }
};

TEST_P(VarlenGpu, EachSequenceMatchesItsFloat64Reference) {
  const auto &[args, env] = GetParam();
  std::string out = runAndCheck(args, env);
  // A sequence's rows are no tensor map's: the ring copies by cp.async.
  if (out.find("\"tensor_maps\"") != std::string::npos)
    EXPECT_NE(out.find("\"tensor_maps\":0"), std::string::npos) << out;
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(Forward, VarlenGpu, ::testing::Values(
  // The default tilings (sm_90a: the ring at d = 128).
  VarlenCase{"--head-dim 128 --heads 16 --seqlens-q 1000,1,257,4096,0,130", ""},
  VarlenCase{"--head-dim 128 --heads 8 --gqa 4 --causal --seqlens-q 700,33,1500 --seqlens-kv 900,33,1200", ""},
  VarlenCase{"--head-dim 64 --heads 4 --window 64,8 --seqlens-q 300,2000,17", ""},
  VarlenCase{"--head-dim 256 --head-dim-v 128 --dtype fp16 --heads 4 --causal --seqlens-q 129,400 --seqlens-kv 200,300", ""},
  VarlenCase{"--head-dim 80 --heads 4 --score-mod softcap:20 --causal --seqlens-q 64,513,9", ""},
  VarlenCase{"--head-dim 128 --heads 4 --seqlens-q 40,0,300 --seqlens-kv 0,10,300", ""},
  VarlenCase{"--head-dim 128 --heads 8 --causal --block-m 128 --block-n 128 --warps 8 --overlap-softmax --seqlens-q 1025,77,640", ""},
  // Warpgroup MMAs without the ring; mma.sync.
  VarlenCase{"--head-dim 128 --heads 4 --gqa 2 --causal --block-m 128 --block-n 64 --warps 8 --seqlens-q 300,1000,5", "FLASHJIT_KV_RING=0"},
  VarlenCase{"--head-dim 96 --heads 4 --block-m 64 --block-n 64 --warps 4 --seqlens-q 200,31,999", "FLASHJIT_WGMMA=0"},
  // Split-KV decode: one query per sequence, GQA packed, auto splits.
  VarlenCase{"--head-dim 128 --heads 32 --gqa 8 --seqlens-q 1,1,1,1 --seqlens-kv 30000,7,4096,0", ""},
  VarlenCase{"--head-dim 64 --heads 8 --gqa 4 --causal --kv-splits 5 --block-m 16 --block-n 32 --warps 1 --seqlens-q 3,1,8 --seqlens-kv 900,2000,8", ""},
  // The backward, both dQ modes.
  VarlenCase{"--backward --head-dim 128 --heads 8 --gqa 2 --causal --seqlens-q 700,1,300 --seqlens-kv 900,40,300", ""},
  VarlenCase{"--backward --deterministic --head-dim 64 --heads 4 --window 32,0 --seqlens-q 500,129,0,64 --seqlens-kv 500,100,7,64", ""},
  VarlenCase{"--backward --head-dim 96 --head-dim-v 64 --dtype fp16 --heads 2 --score-mod softcap:10 --seqlens-q 257,1000", ""}));
// clang-format on

} // namespace
