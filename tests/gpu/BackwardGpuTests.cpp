//===- BackwardGpuTests.cpp - The GPU backward vs float64 gradients -------===//
//
/// \file
/// Runs `flashjit run --backward --device cuda --json` over the matrix of
/// tests/unit/CpuBackwardTests.cpp (head dims 1..512 incl. odd ones, dqk !=
/// dv, > 256, bf16/fp16, causal, sliding windows, block-sparse layouts incl.
/// an empty Q-block row, GQA, packed qkv strides, rows that see no key) and
/// larger shapes. The CLI does what a kernel test must: fresh random inputs,
/// the GPU forward's O and lse, NaN-poisoned gradients, one checked launch
/// against float64 gradients (batch 0's first KV head group for large
/// problems). Plus: bit-identical gradients for one --seed, `bench
/// --backward`'s FLOP count, and `tune --backward` stored apart from the
/// forward. Skipped, and shown as skipped, without a driver.
///
/// The matrix's processes run 8 at a time, started by the first test that
/// needs one: compiling the cubins dominates, and one after another they
/// would take minutes on a cold cache.
//
//===----------------------------------------------------------------------===//

#include "runtime/CudaDriver.h"
#include "tests/gpu/CliRunner.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

using flashjit::test::CliResult;
using flashjit::test::jsonNumber;
using flashjit::test::runFlashjit;

struct GpuCase {
  const char *name;
  const char *args; ///< after `run --backward --device cuda --json`
};

void PrintTo(const GpuCase &c, std::ostream *os) { *os << c.name; }

/// "{empty_row_layout}" in a case's arguments: a 4 x 4 layout of 64-blocks
/// whose Q block 1 lists no KV block (its rows see no key) and whose block
/// (0, 0) is missing, as LayoutKind::EmptyRow of the CPU suite.
constexpr const char *kEmptyRowLayout = "{empty_row_layout}";

// clang-format off
const GpuCase kCases[] = {
  {"d1_n17", "--head-dim 1 --batch 2 --heads 8 --seq-len 17"},
  {"d16_fp16_n1_nkv1", "--head-dim 16 --dtype fp16 --seq-len 1"},
  {"d16_causal_n1000", "--head-dim 16 --causal --seq-len 1000"},
  {"d33_dv64_nq_lt_nkv_causal", "--head-dim 33 --head-dim-v 64 --causal --seq-len 17 --seq-len-kv 300"},
  {"d64_fp16_window", "--head-dim 64 --dtype fp16 --window 50,20 --seq-len 257"},
  {"d80_gqa4", "--head-dim 80 --gqa 4 --batch 2 --heads 8 --seq-len 64"},
  {"d96_causal_nq_gt_nkv_empty_rows", "--head-dim 96 --causal --heads 2 --seq-len 300 --seq-len-kv 100"},
  {"d128_sparse_random", "--head-dim 128 --heads 2 --seq-len 300 --block-sparse 0.5 --sparse-block 64"},
  {"d160_dv128_fp16_sparse_emptyrow_causal", "--head-dim 160 --head-dim-v 128 --dtype fp16 --causal --heads 2 --seq-len 256 --sparse-block 64 --layout {empty_row_layout}"},
  {"d256_sparse_full_window", "--head-dim 256 --window 64,64 --seq-len 200 --block-sparse 1.0 --sparse-block 64"},
  {"d512_dv32", "--head-dim 512 --head-dim-v 32 --seq-len 64"},
  {"d32_dv512_fp16_causal", "--head-dim 32 --head-dim-v 512 --dtype fp16 --causal --seq-len 40 --seq-len-kv 50"},
  {"d64_packed_qkv_causal", "--head-dim 64 --packed-qkv --causal --batch 2 --heads 4 --seq-len 200"},
  {"d128_fp16_window_nq_gt_nkv", "--head-dim 128 --dtype fp16 --window 10,10 --seq-len 300 --seq-len-kv 100"},
  {"d64_gqa2_causal_sparse_random", "--head-dim 64 --gqa 2 --causal --block-sparse 0.5 --batch 2 --heads 4 --seq-len 256"},
  {"d32_dv16_fp16_window_left_only", "--head-dim 32 --head-dim-v 16 --dtype fp16 --window 5,0 --seq-len 100 --seq-len-kv 140"},
  // dK and dV in one program up to dqk + dv = 256 (padded), split past it.
  {"d144_dv112_combined_limit", "--head-dim 144 --head-dim-v 112 --causal --seq-len 130"},
  {"d144_dv128_split", "--head-dim 144 --head-dim-v 128 --gqa 2 --heads 2 --seq-len 130"},
  {"d300_dv400_causal", "--head-dim 300 --head-dim-v 400 --causal --seq-len 200"},
  // Tilings other than the default: two 16-row tiles per warp (dQ), two
  // 16-key tiles per warp (dK/dV); atomic dQ's warps split 64-column groups
  // in 4, 2 or 1 pieces (8, 2 or 1 warps).
  {"d128_br128_bc64_w4", "--head-dim 128 --block-m 128 --block-n 64 --warps 4 --seq-len 777"},
  {"d64_br32_bc64_w2_causal", "--head-dim 64 --block-m 32 --block-n 64 --warps 2 --causal --seq-len 999"},
  {"d200_br16_bc16_w1_window", "--head-dim 200 --block-m 16 --block-n 16 --warps 1 --window 30,40 --seq-len 301"},
  {"d96_br32_bc128_w8_gqa2", "--head-dim 96 --block-m 32 --block-n 128 --warps 8 --gqa 2 --heads 2 --seq-len 400"},
  // dQ by the separate pass (--deterministic; the rest: atomic dQ).
  {"det_d1_n17", "--deterministic --head-dim 1 --batch 2 --heads 8 --seq-len 17"},
  {"det_d33_dv64_nq_lt_nkv_causal", "--deterministic --head-dim 33 --head-dim-v 64 --causal --seq-len 17 --seq-len-kv 300"},
  {"det_d96_causal_nq_gt_nkv_empty_rows", "--deterministic --head-dim 96 --causal --heads 2 --seq-len 300 --seq-len-kv 100"},
  {"det_d128_sparse_random", "--deterministic --head-dim 128 --heads 2 --seq-len 300 --block-sparse 0.5 --sparse-block 64"},
  {"det_d160_dv128_fp16_sparse_emptyrow_causal", "--deterministic --head-dim 160 --head-dim-v 128 --dtype fp16 --causal --heads 2 --seq-len 256 --sparse-block 64 --layout {empty_row_layout}"},
  {"det_d144_dv128_split", "--deterministic --head-dim 144 --head-dim-v 128 --gqa 2 --heads 2 --seq-len 130"},
  {"det_d300_dv400_causal", "--deterministic --head-dim 300 --head-dim-v 400 --causal --seq-len 200"},
  {"det_d128_br128_bc64_w4", "--deterministic --head-dim 128 --block-m 128 --block-n 64 --warps 4 --seq-len 777"},
  {"det_d64_br32_bc64_w2_causal", "--deterministic --head-dim 64 --block-m 32 --block-n 64 --warps 2 --causal --seq-len 999"},
  // Large: N = 4096, B * H = 8 (batch 0's first KV head group is checked).
  // Warpgroup MMAs (sm_90a; named wg_: the run must report kv_mma wgmma
  // there): one warpgroup; dQ split over the keys (dqk 64 over two
  // warpgroups); fp16 with Nkv past a 64-key block; GQA with a window.
  {"wg_d128_bc64_w4_causal_gqa2", "--head-dim 128 --block-m 64 --block-n 64 --warps 4 --causal --gqa 2 --heads 4 --seq-len 333"},
  {"wg_d64_dv128_window", "--head-dim 64 --head-dim-v 128 --block-m 64 --block-n 128 --warps 8 --window 100,30 --seq-len 500"},
  {"wg_d128_fp16_nkv_odd", "--head-dim 128 --dtype fp16 --seq-len 200 --seq-len-kv 333"},
  {"wg_d64_gqa4_window_bc128", "--head-dim 64 --gqa 4 --heads 8 --block-m 64 --block-n 128 --warps 8 --window 64,0 --seq-len 700"},
  {"large_d128_n4096_bh8", "--head-dim 128 --batch 2 --heads 4 --seq-len 4096"},
  {"large_det_d128_causal_n4096_bh8", "--deterministic --head-dim 128 --causal --batch 2 --heads 4 --seq-len 4096"},
  {"large_d64_causal_gqa2_n4096_bh8", "--head-dim 64 --causal --gqa 2 --heads 8 --seq-len 4096"},
  // Score modifiers: P from the modified scores, dS through the derivative
  // the tiling derives (wgmma dK/dV kernel, the mma.sync dQ pass, GQA).
  {"mod_softcap5_d128_causal", "--head-dim 128 --score-mod softcap:5 --causal --heads 2 --seq-len 700"},
  {"mod_det_softcap2_d64_gqa2", "--deterministic --head-dim 64 --score-mod softcap:2 --gqa 2 --heads 4 --seq-len 300 --seq-len-kv 420"},
  {"mod_alibi8_d128_gqa4_window", "--head-dim 128 --score-mod alibi:8 --gqa 4 --heads 8 --window 100,20 --seq-len 500"},
  {"mod_det_alibi4_d96_fp16", "--deterministic --head-dim 96 --dtype fp16 --score-mod alibi:4 --heads 4 --seq-len 257"},
  // A region given as text (run from the repository root).
  {"mod_region_distance_d128", "--head-dim 128 --score-mod @tests/lit/Inputs/score-mod-distance.mlir --heads 2 --seq-len 500"},
};
// clang-format on

bool gpuPresent() { return flashjit::rt::CudaDriver::get().available(); }

std::string tempPath(const std::string &what) {
  return "/tmp/flashjit-bwd-gpu-" + std::to_string(getpid()) + "-" + what;
}

/// The full argument list of a matrix case: the layout file made, random
/// layouts given a fresh --seed (reported on failure).
std::string caseArgs(const GpuCase &c) {
  std::string args = c.args;
  if (auto at = args.find(kEmptyRowLayout); at != std::string::npos) {
    std::string path = tempPath("empty-row-layout.txt");
    std::ofstream(path) << "0 1 1 1\n0 0 0 0\n1 1 1 1\n1 1 1 1\n";
    args.replace(at, std::string(kEmptyRowLayout).size(), path);
  }
  if (args.find("--block-sparse") != std::string::npos)
    args += " --seed " + std::to_string(std::random_device{}() % 100000);
  return "run --backward --device cuda --json " + args;
}

/// Will a test that reads case \p name run (--gtest_filter; ctest runs one
/// test per process)? Its matrix test, or for the large cases the test of
/// their check's scope.
bool selected(const std::string &name) {
  const ::testing::UnitTest &unit = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const ::testing::TestSuite &suite = *unit.GetTestSuite(i);
    for (int j = 0; j < suite.total_test_count(); ++j) {
      const ::testing::TestInfo &test = *suite.GetTestInfo(j);
      std::string testName = test.name();
      if (test.should_run() &&
          (testName == "MatchesFloat64Gradients/" + name ||
           (testName == "LargeProblemsCheckTheFirstKvHeadGroup" &&
            name.rfind("large_", 0) == 0)))
        return true;
    }
  }
  return false;
}

/// The runs of the selected matrix cases, started (8 processes at a time)
/// on first use.
class MatrixRuns {
public:
  static MatrixRuns &get() {
    static MatrixRuns runs;
    return runs;
  }
  /// The arguments and the outcome of case \p name.
  std::pair<std::string, CliResult> result(const std::string &name) {
    auto it = index.find(name);
    if (it == index.end()) { // not selected up front: run it now
      for (const GpuCase &c : kCases)
        if (c.name == name) {
          std::string a = caseArgs(c);
          return {a, runFlashjit(a)};
        }
      ADD_FAILURE() << "no matrix case " << name;
      return {"", CliResult{}};
    }
    return {args[it->second], futures[it->second].get()};
  }

private:
  MatrixRuns() {
    for (const GpuCase &c : kCases) {
      if (!selected(c.name))
        continue;
      index[c.name] = args.size();
      args.push_back(caseArgs(c));
      promises.emplace_back();
      futures.push_back(promises.back().get_future().share());
    }
    for (int t = 0; t < 8; ++t)
      workers.emplace_back([this] {
        for (size_t i; !stop && (i = next.fetch_add(1)) < args.size();)
          promises[i].set_value(runFlashjit(args[i]));
      });
  }
  /// At exit (e.g. after a --gtest_filter run): no new process starts;
  /// those running are waited for.
  ~MatrixRuns() {
    stop = true;
    for (std::thread &t : workers)
      t.join();
  }
  std::map<std::string, size_t> index;
  std::vector<std::string> args;
  std::vector<std::promise<CliResult>> promises;
  std::vector<std::shared_future<CliResult>> futures;
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
};

/// The checks every GPU backward run must pass; dq_mode as the run's
/// JSON says its spec asked (--deterministic: the separate pass).
void expectCorrectGradients(const std::string &out) {
  EXPECT_NE(out.find("\"ok\":true"), std::string::npos);
  EXPECT_NE(out.find("\"device\":\"cuda\""), std::string::npos);
  EXPECT_NE(out.find("\"direction\":\"backward\""), std::string::npos);
  const bool deterministic =
      out.find("\"deterministic\":true") != std::string::npos;
  EXPECT_NE(out.find(deterministic ? "\"dq_mode\":\"separate_pass\""
                                   : "\"dq_mode\":\"atomic\""),
            std::string::npos);
  double bound = jsonNumber(out, "bound");
  ASSERT_GT(bound, 0);
  EXPECT_LT(jsonNumber(out, "rel_err"), bound);
  for (const char *key :
       {"dq_rel_err", "dk_rel_err", "dv_rel_err", "forward_rel_err"})
    EXPECT_LT(jsonNumber(out, key), bound) << key;
  EXPECT_EQ(jsonNumber(out, "nan_count"), 0);
  EXPECT_GT(jsonNumber(out, "time_ms"), 0);
}

class BackwardGpu : public ::testing::TestWithParam<GpuCase> {
protected:
  void SetUp() override {
    if (!gpuPresent())
      GTEST_SKIP() << "skipped: no CUDA driver";
  }
};

TEST_P(BackwardGpu, MatchesFloat64Gradients) {
  auto [args, r] = MatrixRuns::get().result(GetParam().name);
  SCOPED_TRACE("flashjit " + args + "\n" + r.out);
  ASSERT_EQ(r.exitCode, 0);
  expectCorrectGradients(r.out);
  // The wg_ cases exist for the warpgroup-MMA kernel: on sm_90a they run it.
  if (std::string(GetParam().name).rfind("wg_", 0) == 0 &&
      r.out.find("\"arch\":\"sm_90a\"") != std::string::npos)
    EXPECT_NE(r.out.find("\"kv_mma\":\"wgmma\""), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Matrix, BackwardGpu, ::testing::ValuesIn(kCases),
                         [](const auto &info) {
                           return std::string(info.param.name);
                         });

class BackwardGpuRuns : public ::testing::Test {
protected:
  void SetUp() override {
    if (!gpuPresent())
      GTEST_SKIP() << "skipped: no CUDA driver";
  }
};

/// Large problems check batch 0's first KV head group, and say so.
TEST_F(BackwardGpuRuns, LargeProblemsCheckTheFirstKvHeadGroup) {
  for (auto [name, group] :
       {std::pair<const char *, int>{"large_d128_n4096_bh8", 1},
        {"large_d64_causal_gqa2_n4096_bh8", 2}}) {
    auto [args, r] = MatrixRuns::get().result(name);
    SCOPED_TRACE("flashjit " + args + "\n" + r.out);
    ASSERT_EQ(r.exitCode, 0);
    EXPECT_EQ(jsonNumber(r.out, "checked_heads"), group);
    EXPECT_NE(r.out.find("\"checked_rows\":null"), std::string::npos);
  }
}

/// Softcap's tanh by a polynomial where each warp's arguments lie in
/// [-1, 1] (FLASHJIT_TANH_POLYNOMIAL=8, all of its registers,
/// TileToGPUTanh.cpp): the gradients match float64 with every warp on the
/// polynomial (softcap:30), on either side (softcap:2, causal, Nq != Nkv;
/// GQA), and at d 64 and d 256.
TEST_F(BackwardGpuRuns, TanhPolynomialMatchesFloat64Gradients) {
  for (const char *args :
       {"--head-dim 128 --score-mod softcap:30 --heads 4 --seq-len 1000",
        "--head-dim 128 --score-mod softcap:2 --causal --heads 4 "
        "--seq-len 700 --seq-len-kv 900",
        "--head-dim 64 --score-mod softcap:3 --gqa 2 --heads 4 --seq-len 600",
        "--head-dim 256 --score-mod softcap:2 --heads 2 --seq-len 500"}) {
    CliResult r =
        runFlashjit(std::string("run --backward --device cuda --json ") + args,
                    "FLASHJIT_TANH_POLYNOMIAL=8");
    SCOPED_TRACE(std::string(args) + "\n" + r.out);
    ASSERT_EQ(r.exitCode, 0);
    expectCorrectGradients(r.out);
  }
}

/// Files \p dir/\p name, read whole.
std::string readFile(const std::string &dir, const std::string &name) {
  std::ifstream in(dir + "/" + name, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// --deterministic (dQ by a separate pass, no atomics): one --seed, the same
/// bits; GQA sums dK and dV over a group, a layout skips blocks.
TEST_F(BackwardGpuRuns, SameSeedSameGradientsBitForBit) {
  const std::string args =
      "run --backward --device cuda --json --deterministic --head-dim 96 "
      "--gqa 2 --heads 4 --batch 2 --causal --seq-len 1000 --block-sparse 0.7 "
      "--sparse-block 64";
  std::string a = tempPath("seed-a"), b = tempPath("seed-b"),
              c = tempPath("seed-c");
  CliResult ra = runFlashjit(args + " --seed 7 --dump-io " + a);
  CliResult rb = runFlashjit(args + " --seed 7 --dump-io " + b);
  CliResult rc = runFlashjit(args + " --seed 8 --dump-io " + c);
  SCOPED_TRACE(ra.out + rb.out + rc.out);
  ASSERT_EQ(ra.exitCode, 0);
  ASSERT_EQ(rb.exitCode, 0);
  ASSERT_EQ(rc.exitCode, 0);
  for (const char *f :
       {"q.npy", "do.npy", "o.npy", "lse.npy", "dq.npy", "dk.npy", "dv.npy"}) {
    std::string first = readFile(a, f);
    EXPECT_GT(first.size(), 128u) << f;
    EXPECT_EQ(first, readFile(b, f)) << f << " differs between two runs";
  }
  EXPECT_NE(readFile(a, "q.npy"), readFile(c, "q.npy"))
      << "another seed must give other inputs";
  EXPECT_NE(readFile(a, "dq.npy"), readFile(c, "dq.npy"));
  std::system(("rm -rf " + a + " " + b + " " + c).c_str());
}

/// `bench --backward`: the backward alone, TFLOP/s = 2.5 x the forward's
/// 4 B H N^2 d / time; a sampled check within bench's budget.
TEST_F(BackwardGpuRuns, BenchCountsTwoAndAHalfForwardFlops) {
  CliResult r = runFlashjit("bench --backward --head-dim 128 --heads 8 "
                            "--seq-len 4096 --repeats 5 --json");
  SCOPED_TRACE(r.out);
  ASSERT_EQ(r.exitCode, 0);
  expectCorrectGradients(r.out);
  double ms = jsonNumber(r.out, "time_ms");
  double flops = 2.5 * 4.0 * 8 * 4096.0 * 4096.0 * 128;
  EXPECT_NEAR(jsonNumber(r.out, "tflops"), flops / (ms * 1e-3) / 1e12,
              0.01 * jsonNumber(r.out, "tflops") + 0.01);
  EXPECT_EQ(jsonNumber(r.out, "repeats"), 5);
  EXPECT_GT(jsonNumber(r.out, "checked_rows"), 0) << "a sampled check";
  EXPECT_GT(jsonNumber(r.out, "checked_keys"), 0);
}

/// `tune --backward` stores the backward's winner; later backward runs
/// take it, the forward (of the run and on its own) does not.
TEST_F(BackwardGpuRuns, TunedBackwardConfigIsStoredApartFromTheForward) {
  std::string cache = tempPath("tune-cache");
  std::string env = "FLASHJIT_CACHE_DIR=" + cache;
  const std::string problem = "--head-dim 64 --heads 4 --seq-len 512 --json";
  CliResult tuned = runFlashjit("tune --backward " + problem, env);
  SCOPED_TRACE(tuned.out);
  ASSERT_EQ(tuned.exitCode, 0);
  expectCorrectGradients(tuned.out);
  EXPECT_NE(tuned.out.find("\"config_source\":\"tuned\""), std::string::npos);
  size_t candidates = 0;
  for (size_t at = tuned.out.find("{\"config\":"); at != std::string::npos;
       at = tuned.out.find("{\"config\":", at + 1))
    ++candidates;
  EXPECT_GE(candidates, 2u);

  CliResult again = runFlashjit("run --backward --device cuda " + problem, env);
  SCOPED_TRACE(again.out);
  ASSERT_EQ(again.exitCode, 0);
  EXPECT_NE(again.out.find("\"config_source\":\"tuned\""), std::string::npos);
  EXPECT_NE(again.out.find("\"forward_config_source\":\"heuristic\""),
            std::string::npos);
  CliResult forward = runFlashjit("run --device cuda " + problem, env);
  SCOPED_TRACE(forward.out);
  EXPECT_NE(forward.out.find("\"config_source\":\"heuristic\""),
            std::string::npos);
  std::system(("rm -rf " + cache).c_str());
}

} // namespace
