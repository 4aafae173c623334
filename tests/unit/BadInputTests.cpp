//===- BadInputTests.cpp - Every bad input is a named error ---------------===//
//
/// \file
/// The checks shared by the CLI, the C API and the Python binding (issue
/// 16): the total size of a problem, the reach of a strided view, the
/// scale's bounds, the layout file reader's bound, and a layout that lists a
/// KV block twice. Each test names the bad field and value it expects.
//
//===----------------------------------------------------------------------===//

#include "kernels/AttentionSpec.h"
#include "kernels/HostTensor.h"
#include "tools/cli/CliOptions.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

using namespace flashjit;

namespace {

/// The SpecError message of \p fn, or "" (and a test failure) if none.
template <typename Fn> std::string errorOf(Fn fn) {
  try {
    fn();
  } catch (const SpecError &e) {
    return e.what();
  }
  ADD_FAILURE() << "no SpecError";
  return "";
}

cli::CliOptions parseArgs(std::vector<const char *> args) {
  args.insert(args.begin(), "flashjit");
  return cli::parseCommandLine(int(args.size()), args.data());
}

#define EXPECT_CONTAINS(text, needle)                                          \
  EXPECT_NE(std::string(text).find(needle), std::string::npos) << (text)

TEST(ProblemSize, RefusesATotalPastTheLimitAndAnInt64Overflow) {
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = 1;
  Problem p;
  p.batch = int64_t(1) << 20;
  p.heads = int64_t(1) << 20;
  p.seqLenQ = p.seqLenKV = int64_t(1) << 24; // 2^64: wraps to 0 in int64
  EXPECT_NO_THROW(p.validate(spec));         // every dimension in range
  std::string e = errorOf([&] { checkProblemSize(spec, p); });
  EXPECT_CONTAINS(e, "problem too large: q would hold batch * heads * seq_len "
                     "* head_dim_qk = 1048576 * 1048576 * 16777216 * 1 "
                     "elements (overflows int64)");
  // Past 2^40 without overflowing: the product is named.
  p.batch = 1 << 10;
  p.heads = 1 << 10;
  p.seqLenQ = p.seqLenKV = 1 << 20;
  spec.headDimQK = spec.headDimV = 2;
  e = errorOf([&] { checkProblemSize(spec, p); });
  EXPECT_CONTAINS(e, "= 2199023255552 elements; the limit is 2^40");
  // Exactly 2^40 is accepted.
  spec.headDimQK = spec.headDimV = 1;
  EXPECT_NO_THROW(checkProblemSize(spec, p));
}

TEST(ProblemSize, KvHeadsAndTheLayoutCount) {
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = 512;
  spec.gqaGroup = 1024;
  Problem p;
  p.batch = 1;
  p.heads = 1024;
  p.seqLenQ = 1;
  p.seqLenKV = int64_t(1) << 24;
  // k: 1 * 1 * 2^24 * 512 = 2^33, fine; q: 1024 * 512, fine.
  EXPECT_NO_THROW(checkProblemSize(spec, p));
  p.batch = 1 << 8; // k: 2^41
  EXPECT_CONTAINS(errorOf([&] { checkProblemSize(spec, p); }),
                  "k would hold batch * kv_heads * seq_len_kv * head_dim_qk");
  // A block-sparse problem's [q_blocks, kv_blocks] at sparse block 1.
  AttentionSpec sparse;
  sparse.headDimQK = sparse.headDimV = 1;
  sparse.blockSparse = true;
  sparse.sparseBlock = 1;
  Problem q;
  q.seqLenQ = q.seqLenKV = int64_t(1) << 21;
  EXPECT_CONTAINS(errorOf([&] { checkProblemSize(sparse, q); }),
                  "the layout's indices would hold q_blocks * kv_blocks");
}

TEST(ProblemSize, TheCliRefusesBeforeAllocating) {
  // The example: it segfaulted (139) on the wrapped product.
  std::string e = errorOf([] {
    parseArgs({"run", "--device", "cpu", "--head-dim", "1", "--seq-len",
               "16777216", "--batch", "1048576", "--heads", "1048576"});
  });
  EXPECT_CONTAINS(e, "problem too large: q would hold");
  EXPECT_CONTAINS(e, "(overflows int64)");
  // A random layout is drawn per (batch, head): bounded too, where it is
  // drawn (the problem itself fits).
  cli::CliOptions o =
      parseArgs({"run", "--head-dim", "1", "--seq-len", "65536", "--batch",
                 "1024", "--heads", "1024", "--block-sparse", "0.5",
                 "--sparse-block", "16", "--block-m", "16", "--block-n", "16"});
  e = errorOf([&] { cli::layoutFromOptions(o, 1); });
  EXPECT_CONTAINS(e, "problem too large: a random layout of batch * heads * "
                     "q_blocks * kv_blocks = 1024 * 1024 * 4096 * 4096 "
                     "blocks exceeds 2^40");
  // compile takes no problem: it refuses the problem's flags by name.
  EXPECT_CONTAINS(errorOf([] {
                    parseArgs({"compile", "--batch", "1048576", "--heads",
                               "1048576", "--seq-len", "16777216"});
                  }),
                  "compile: --batch is an option of run, bench and tune");
}

TEST(TensorReach, RefusesAStrideOf2To62) {
  int64_t shape[4] = {2, 1, 1, 8};
  int64_t strides[4] = {int64_t(1) << 62, 8, 8, 1};
  std::string e = errorOf([&] { checkTensorReach("q", shape, strides); });
  EXPECT_CONTAINS(e, "q: shape [2, 1, 1, 8] with strides [4611686018427387904,"
                     " 8, 8, 1] reaches past element 2^47");
  // Overflowing int64 in the product, and in the sum.
  int64_t huge[4] = {1 << 20, 1 << 20, 1 << 24, 1};
  int64_t packed[4] = {int64_t(1) << 44, int64_t(1) << 24, 1, 1};
  EXPECT_CONTAINS(errorOf([&] { checkTensorReach("k", huge, packed); }),
                  "k: shape");
  int64_t sum[4] = {int64_t(1) << 62, int64_t(1) << 62, 1, 1};
  int64_t two[4] = {2, 2, 1, 1};
  EXPECT_CONTAINS(errorOf([&] { checkTensorReach("v", two, sum); }), "v:");
  // A stride of 2^62 along a dimension of size 1 is never multiplied.
  int64_t one[4] = {1, 1, 4, 8};
  int64_t wide[4] = {int64_t(1) << 62, int64_t(1) << 62, 8, 1};
  EXPECT_NO_THROW(checkTensorReach("q", one, wide));
  // Exactly 2^47 is accepted.
  int64_t edge[4] = {2, 1, 1, 1};
  int64_t edgeStrides[4] = {int64_t(1) << 47, 1, 1, 1};
  EXPECT_NO_THROW(checkTensorReach("o", edge, edgeStrides));
  edgeStrides[0] += 1;
  EXPECT_CONTAINS(errorOf([&] { checkTensorReach("o", edge, edgeStrides); }),
                  "o:");
}

TEST(Scale, FiniteButOverflowingOrDenormalIsRefused) {
  AttentionSpec spec;
  Problem p;
  for (double bad : {1e38, 1e19, 0x1p63 * 1.0000001, 1e-320, 1e-39}) {
    p.scale = bad;
    EXPECT_CONTAINS(errorOf([&] { p.validate(spec); }),
                    "scale must be 0 (1/sqrt(head_dim)) or in [2^-126, 2^63]")
        << bad;
  }
  for (double good : {0.0, 0x1p-126, 1e-30, 0.125, 1e18, 0x1p63}) {
    p.scale = good;
    EXPECT_NO_THROW(p.validate(spec)) << good;
  }
  // The bound's promise: scale * log2(e) * score finite in f32 for every
  // |score| < 2^64.
  float scaleLog2e = float(0x1p63 * 1.4426950408889634);
  EXPECT_TRUE(std::isfinite(scaleLog2e * float(0x1p64 * 0.99999)));
  // The CLI: a denormal is a number, refused by its range.
  EXPECT_CONTAINS(errorOf([] {
                    parseArgs({"run", "--scale", "1e-320"});
                  }),
                  "got 1e-320");
  EXPECT_CONTAINS(errorOf([] {
                    parseArgs({"run", "--scale", "1e38"});
                  }),
                  "got 1e+38");
  EXPECT_CONTAINS(errorOf([] {
                    parseArgs({"run", "--scale", "1e400"});
                  }),
                  "--scale: '1e400' is out of the range of a double");
  EXPECT_CONTAINS(errorOf([] {
                    parseArgs({"run", "--scale", "0.5x"});
                  }),
                  "--scale: expected a number, got '0.5x'");
}

class LayoutFile : public ::testing::Test {
protected:
  std::filesystem::path dir;
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() /
          ("flashjit-layout-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
};

TEST_F(LayoutFile, DevZeroIsReadWithABound) {
  if (!std::filesystem::exists("/dev/zero"))
    GTEST_SKIP() << "no /dev/zero";
  std::string e = errorOf([] { BlockSparseLayout::readText("/dev/zero"); });
  EXPECT_CONTAINS(e, "layout: '/dev/zero' holds more than 67108864 bytes");
}

TEST_F(LayoutFile, ADirectoryIsNamed) {
  std::string path = dir.string();
  EXPECT_CONTAINS(errorOf([&] { BlockSparseLayout::readText(path); }),
                  "is a directory, not a layout file");
  EXPECT_CONTAINS(
      errorOf([&] { BlockSparseLayout::readText(path + "/missing.txt"); }),
      "layout: cannot open");
}

TEST_F(LayoutFile, ALargeRegularFileIsRefusedUnread) {
  std::string path = (dir / "big.txt").string();
  {
    std::ofstream f(path);
    f << "1\n";
  }
  std::filesystem::resize_file(path, uintmax_t(kMaxLayoutFileBytes) + 1);
  EXPECT_CONTAINS(errorOf([&] { BlockSparseLayout::readText(path); }),
                  "is 67108865 bytes; a layout file may hold at most");
  // A NUL byte is shown escaped, not printed raw.
  std::string nul = (dir / "nul.txt").string();
  {
    std::ofstream f(nul, std::ios::binary);
    f << "1 " << '\0' << "0\n";
  }
  EXPECT_CONTAINS(errorOf([&] { BlockSparseLayout::readText(nul); }),
                  "expected 0, 1 or 2 (full), got '\\x000'");
  // A good file still reads.
  std::string good = (dir / "good.txt").string();
  {
    std::ofstream f(good);
    f << "# a comment\n1 0\n0 1\n";
  }
  BlockSparseLayout l = BlockSparseLayout::readText(good);
  EXPECT_EQ(l.qBlocks, 2);
  EXPECT_EQ(l.kvBlocks, 2);
  EXPECT_TRUE(l.contains(0, 0, 1, 1));
}

TEST(LayoutFits, AKvBlockListedTwiceIsRefusedForTheForward) {
  Problem p;
  p.seqLenQ = p.seqLenKV = 256;
  BlockSparseLayout l;
  l.qBlocks = l.kvBlocks = 2;
  l.counts = {2, 1};
  l.indices = {0, 1, 1, 1}; // Q block 1 lists only block 1: fine
  EXPECT_NO_THROW(l.checkFits(p, 128));
  l.counts = {1, 2}; // Q block 1 lists KV block 1 twice
  EXPECT_CONTAINS(errorOf([&] { l.checkFits(p, 128); }),
                  "layout: KV block 1 is listed twice for batch 0, head 0, Q "
                  "block 1");
  // The same message as the backward's transpose gives.
  EXPECT_CONTAINS(errorOf([&] { (void)l.transposed(); }),
                  "KV block 1 is listed twice for batch 0, head 0, Q block 1");
  // Counts and indices that disagree with the shape.
  l.counts = {1};
  EXPECT_CONTAINS(errorOf([&] { l.checkFits(p, 128); }),
                  "layout: 1 counts and 4 indices given");
}

TEST(DumpDirectory, AnUnusableTargetIsANamedError) {
  std::string file = std::filesystem::temp_directory_path() /
                     ("flashjit-dump-file-" + std::to_string(::getpid()));
  {
    std::ofstream f(file);
    f << "x";
  }
  std::string e = errorOf([&] { prepareDumpDirectory(file); });
  EXPECT_CONTAINS(e, "--dump-io: ");
  EXPECT_CONTAINS(e, file);
  EXPECT_CONTAINS(errorOf([&] { prepareDumpDirectory(file + "/sub"); }),
                  "--dump-io: cannot create the directory");
  std::filesystem::remove(file);
  if (std::filesystem::exists("/dev/full")) {
    e = errorOf(
        [] { writeNpyF32("/dev/full", {2}, std::vector<float>(4096, 1.0f)); });
    EXPECT_CONTAINS(e, "cannot write '/dev/full': No space left on device");
  }
}

} // namespace
