//===- CapturedGpuTests.cpp - Score modifiers that read tensors, on the GPU
//===//
//
/// \file
/// A score_mod region that captures tensors (TileAttention.cpp gathers them
/// with tile.gather; TileToGPUMemory.cpp loads each register's element) on
/// the GPU: fresh random captured data written as .npy files, then `flashjit
/// run --device cuda --capture ...` checked against the float64 reference on
/// the same data (which also checks that the kernel read them: the run fails
/// on any other data, see CapturedTensors.* on the CPU). Covers the sm_90a
/// default (the K/V ring), wgmma without the ring, mma.sync tilings,
/// split-KV decode with GQA packing, masks, GQA and Nq != Nkv; forward, and
/// the backward's dQ, dK, dV (the region recomputed on the same data) and
/// the captured tensors' gradients, atomic and deterministic (fixed point:
/// the same bits in two runs).
/// Skipped, and shown as skipped, without a driver.
//
//===----------------------------------------------------------------------===//

#include "runtime/CudaDriver.h"
#include "tests/gpu/CliRunner.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using flashjit::test::jsonNumber;
using flashjit::test::runFlashjit;

/// Writes \p v as a 1-D float32 .npy file.
void writeNpy(const std::string &path, const std::vector<float> &v) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                       std::to_string(v.size()) + ",), }";
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  uint16_t len = uint16_t(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char *>(&len), 2);
  out << header;
  out.write(reinterpret_cast<const char *>(v.data()),
            std::streamsize(v.size() * 4));
  ASSERT_TRUE(out.good()) << path;
}

/// The region files and data of one case.
/// What a captured tensor holds: uniform values in [-2, 2] (a bias),
/// segment ids (documents of 1..400 positions, in order), or slopes in
/// [-4, 4] / Nkv (so that slope * (j - i) stays within [-4, 4]: ALiBi-like,
/// not a softmax saturated on one key, whose slope gradient is rounding
/// noise).
enum class Fill { Uniform, Segments, Slopes };

struct Case {
  const char *name;
  const char *region; ///< the score_mod region's text ({N}: Nq, {M}: Nkv)
  const char *flags;  ///< the problem and the forward's tiling
  int64_t heads, nq, nkv;
  /// The sizes of the captured tensors and what each holds.
  std::vector<std::pair<int64_t, Fill>> tensors;
  /// The backward's tiling flags where the forward's are not one (else "").
  const char *backwardTiling = "";
};

/// s + slopes[h] * (j - i): trainable ALiBi's forward.
const char *kSlopes = R"({
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index, %t: memref<?xf32>):
  %slope = memref.load %t[%h] : memref<?xf32>
  %d = arith.subi %j, %i : index
  %di = arith.index_cast %d : index to i32
  %df = arith.sitofp %di : i32 to f32
  %x = arith.mulf %slope, %df : f32
  %y = arith.addf %s, %x : f32
  attn.yield %y : f32
})";

/// s + bias[(h * Nq + i) * Nkv + j] where seg[i] == seg[j], else -inf.
const char *kBiasAndDocuments = R"({
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index, %bias: memref<?xf32>, %seg: memref<?xf32>):
  %nq = arith.constant {N} : index
  %nkv = arith.constant {M} : index
  %hq = arith.muli %h, %nq : index
  %row = arith.addi %hq, %i : index
  %rk = arith.muli %row, %nkv : index
  %at = arith.addi %rk, %j : index
  %x = memref.load %bias[%at] : memref<?xf32>
  %si = memref.load %seg[%i] : memref<?xf32>
  %sj = memref.load %seg[%j] : memref<?xf32>
  %same = arith.cmpf oeq, %si, %sj : f32
  %biased = arith.addf %s, %x : f32
  %ninf = arith.constant 0xFF800000 : f32
  %y = arith.select %same, %biased, %ninf : f32
  attn.yield %y : f32
})";

/// s + table[j - i + Nq - 1]: a learned relative-position bias (T5-style,
/// one table for all heads).
const char *kRelative = R"({
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index, %t: memref<?xf32>):
  %off = arith.constant {N1} : index
  %d = arith.subi %j, %i : index
  %at = arith.addi %d, %off : index
  %x = memref.load %t[%at] : memref<?xf32>
  %y = arith.addf %s, %x : f32
  attn.yield %y : f32
})";

std::string replaceAll(std::string s, const std::string &from,
                       const std::string &to) {
  for (size_t at = s.find(from); at != std::string::npos;
       at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

class CapturedGpu : public ::testing::TestWithParam<Case> {
protected:
  void SetUp() override {
    if (!flashjit::rt::CudaDriver::get().available())
      GTEST_SKIP() << "skipped: no CUDA driver";
    char tmpl[] = "/tmp/flashjit-captured-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
  }
  void TearDown() override {
    if (!dir.empty())
      std::system(("rm -rf '" + dir + "'").c_str());
  }
  void runCase(const Case &c, bool backward);
  /// Writes \p c's region and fresh captured data into dir; the run's
  /// --capture flags.
  std::string writeInputs(const Case &c);
  /// Runs \p c on the inputs \p captures (writeInputs') with \p extra
  /// flags and checks it against the float64 reference; its JSON.
  std::string check(const Case &c, bool backward, const std::string &captures,
                    const std::string &extra = "");
  std::string dir;
};

void CapturedGpu::runCase(const Case &c, bool backward) {
  check(c, backward, writeInputs(c));
}

std::string CapturedGpu::writeInputs(const Case &c) {
  std::string region = replaceAll(c.region, "{N}", std::to_string(c.nq));
  region = replaceAll(region, "{M}", std::to_string(c.nkv));
  region = replaceAll(region, "{N1}", std::to_string(c.nq - 1));
  {
    std::ofstream(dir + "/region.mlir") << region;
  }
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::string captures;
  for (size_t t = 0; t < c.tensors.size(); ++t) {
    auto [size, fill] = c.tensors[t];
    const bool segments = fill == Fill::Segments;
    const float scale = fill == Fill::Slopes ? 2.f / float(c.nkv) : 1.f;
    std::vector<float> v(static_cast<size_t>(size));
    // Segment ids: documents of 1..400 positions, in order.
    int64_t left = 0;
    float id = -1;
    for (float &x : v) {
      if (segments && left-- <= 0) {
        left = int64_t(rng() % 400);
        id += 1;
      }
      x = segments ? id : scale * u(rng);
    }
    std::string path = dir + "/t" + std::to_string(t) + ".npy";
    writeNpy(path, v);
    captures += " --capture " + path;
  }
  return captures;
}

std::string CapturedGpu::check(const Case &c, bool backward,
                               const std::string &captures,
                               const std::string &extra) {
  std::string flags = c.flags + (" " + extra);
  if (backward && *c.backwardTiling) // the problem flags, the tiling's own
    flags = flags.substr(0, flags.find(" --block-m")) + " " + c.backwardTiling +
            " " + extra;
  std::string args = std::string("run --device cuda --json ") +
                     (backward ? "--backward " : "") + "--score-mod @" + dir +
                     "/region.mlir" + captures + " --heads " +
                     std::to_string(c.heads) + " --seq-len " +
                     std::to_string(c.nq) + " --seq-len-kv " +
                     std::to_string(c.nkv) + " " + flags;
  std::string env = std::string(c.name).find("noring") != std::string::npos
                        ? "FLASHJIT_KV_RING=0"
                        : "";
  auto r = runFlashjit(args, env);
  SCOPED_TRACE(env + " flashjit " + args + "\n" + r.out);
  EXPECT_EQ(r.exitCode, 0);
  EXPECT_NE(r.out.find("\"ok\":true"), std::string::npos);
  EXPECT_NE(r.out.find("\"device\":\"cuda\""), std::string::npos);
  EXPECT_LT(jsonNumber(r.out, "rel_err"), jsonNumber(r.out, "bound"));
  EXPECT_EQ(jsonNumber(r.out, "nan_count"), 0);
  // The backward also gives every captured tensor's gradient (atomic adds
  // at the indices the loads read), checked against float64 whole.
  if (backward)
    EXPECT_LT(jsonNumber(r.out, "capture_grads_rel_err"),
              jsonNumber(r.out, "bound"));
  return r.out;
}

/// The "capture_grads_fnv" string of a run's JSON ("" if absent).
std::string gradientBits(const std::string &json) {
  const std::string key = "\"capture_grads_fnv\":\"";
  size_t at = json.find(key);
  return at == std::string::npos ? "" : json.substr(at + key.size(), 16);
}

TEST_P(CapturedGpu, MatchesFloat64Reference) { runCase(GetParam(), false); }

/// dQ, dK, dV and the captured tensors' gradients: the backward's kernels
/// read the captured data (to recompute P and its derivative) and add into
/// their gradients.
TEST_P(CapturedGpu, GradientsMatchFloat64Reference) {
  runCase(GetParam(), true);
}

/// --deterministic: the captured tensors' gradients in fixed point, against
/// float64 as above, and the same bits in two runs of one seed on the same
/// data (their FNV-1a in the JSON).
TEST_P(CapturedGpu, DeterministicGradientsAreTheSameBits) {
  const Case &c = GetParam();
  std::string captures = writeInputs(c);
  std::string first = check(c, true, captures, "--deterministic --seed 11");
  std::string second = check(c, true, captures, "--deterministic --seed 11");
  EXPECT_EQ(gradientBits(first).size(), 16u);
  EXPECT_EQ(gradientBits(first), gradientBits(second));
}

std::string caseName(const ::testing::TestParamInfo<Case> &info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CapturedGpu,
    ::testing::Values(
        Case{"slopes_default_causal",
             kSlopes,
             "--head-dim 128 --causal --batch 2",
             8,
             1000,
             1100,
             {{8, Fill::Slopes}}},
        Case{"slopes_gqa_d64",
             kSlopes,
             "--head-dim 64 --gqa 4",
             8,
             777,
             777,
             {{8, Fill::Slopes}}},
        Case{"slopes_noring",
             kSlopes,
             "--head-dim 128 --block-m 128 --block-n 64 --warps 8",
             4,
             600,
             900,
             {{4, Fill::Slopes}},
             "--block-m 64 --block-n 64 --warps 4"},
        Case{"slopes_mma_sync",
             kSlopes,
             "--head-dim 96 --dtype fp16 --window 100,20 --block-m 64 "
             "--block-n 64 --warps 4",
             2,
             500,
             500,
             {{2, Fill::Slopes}}},
        Case{"slopes_decode_splits",
             kSlopes,
             "--head-dim 128 --gqa 8 --batch 2",
             32,
             1,
             8192,
             {{32, Fill::Slopes}}},
        Case{"bias_documents_causal",
             kBiasAndDocuments,
             "--head-dim 64 --causal",
             2,
             700,
             900,
             {{2 * 700 * 900, Fill::Uniform}, {900, Fill::Segments}}},
        Case{"bias_documents_d256",
             kBiasAndDocuments,
             "--head-dim 256",
             2,
             333,
             333,
             {{2 * 333 * 333, Fill::Uniform}, {333, Fill::Segments}}},
        Case{"relative_fp16",
             kRelative,
             "--head-dim 80 --dtype fp16 --gqa 2",
             4,
             300,
             300,
             {{600, Fill::Uniform}}},
        Case{"relative_sparse",
             kRelative,
             "--head-dim 128 --block-sparse 0.5 --sparse-block 128",
             2,
             1024,
             1024,
             {{2048, Fill::Uniform}}}),
    caseName);

} // namespace
