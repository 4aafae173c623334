//===- SpecTests.cpp - The description, host data and CLI parsing ---------===//

#include "kernels/HalfFloat.h"
#include "kernels/HostTensor.h"
#include "tools/cli/CliOptions.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

using namespace flashjit;

namespace {

/// Round-to-nearest-even of \p x to a float with \p mantBits mantissa bits
/// and the given exponent range, computed in double (the model the bit
/// tricks must agree with).
double roundModel(double x, int mantBits, int minExp) {
  if (x == 0 || std::isinf(x))
    return x;
  int e;
  std::frexp(x, &e); // x = f * 2^e, 0.5 <= |f| < 1
  int exp = std::max(e - 1, minExp);
  double ulp = std::ldexp(1.0, exp - mantBits);
  return std::nearbyint(x / ulp) * ulp;
}

TEST(HalfFloat, Fp16RoundTripsEveryBitPattern) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    float f = fp16ToFloat(uint16_t(bits));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16ToFloat(floatToFp16(f))));
      continue;
    }
    ASSERT_EQ(floatToFp16(f), bits) << "bits " << bits;
  }
}

TEST(HalfFloat, RoundsToNearestEvenLikeTheModel) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> expo(-26, 15);
  std::uniform_real_distribution<double> mant(1, 2);
  for (int i = 0; i < 200000; ++i) {
    float x = float(std::ldexp(mant(rng), int(expo(rng))));
    if (i % 2)
      x = -x;
    double fp16 = roundModel(x, 10, -14);
    if (std::fabs(fp16) >= 65520.0)
      fp16 = std::copysign(INFINITY, x);
    ASSERT_EQ(double(fp16ToFloat(floatToFp16(x))), fp16) << x;
    ASSERT_EQ(double(bf16ToFloat(floatToBf16(x))), roundModel(x, 7, -126)) << x;
  }
  // Ties go to even.
  EXPECT_EQ(floatToBf16(1.0f + 1.0f / 256), floatToBf16(1.0f));
  EXPECT_EQ(floatToFp16(1.0f + 1.0f / 2048), floatToFp16(1.0f));
}

TEST(Spec, ValidationNamesTheField) {
  AttentionSpec spec;
  spec.headDimQK = 0;
  try {
    spec.validate();
    FAIL();
  } catch (const SpecError &e) {
    EXPECT_STREQ(e.what(), "head_dim_qk must be in [1, 512], got 0");
  }
  spec.headDimQK = 64;
  spec.headDimV = 600;
  EXPECT_THROW(spec.validate(), SpecError);
  spec.headDimV = 512;
  EXPECT_NO_THROW(spec.validate());

  spec.blockSparse = true;
  spec.sparseBlock = 128;
  TileConfig config;
  config.blockM = 48;
  try {
    config.validate(spec);
    FAIL();
  } catch (const SpecError &e) {
    EXPECT_STREQ(e.what(), "block_m (48) must divide sparse_block (128)");
  }
  Problem p;
  p.heads = 6;
  spec.gqaGroup = 4;
  EXPECT_THROW(p.validate(spec), SpecError);
  p.heads = 8;
  p.windowLeft = -1;
  EXPECT_THROW(p.validate(spec), SpecError);
}

TEST(Spec, AttnModuleTextCarriesEveryField) {
  AttentionSpec spec;
  spec.headDimQK = 33;
  spec.headDimV = 17;
  spec.dtype = DType::FP16;
  spec.mask = MaskKind::SlidingWindow;
  spec.gqaGroup = 4;
  spec.blockSparse = true;
  spec.sparseBlock = 64;
  std::string text = attnModuleText(spec, "k");
  for (const char *part : {"attn.flash_fwd @k", "element_type = f16", "gqa = 4",
                           "head_dim_qk = 33", "head_dim_v = 17",
                           "mask = \"sliding_window\"", "sparse_block = 64"})
    EXPECT_NE(text.find(part), std::string::npos) << part << " in " << text;
}

/// The backward's `deterministic` reaches the description, the name (cache
/// keys) and the JSON; the forward ignores it.
TEST(Spec, DeterministicOnlyMarksTheBackward) {
  AttentionSpec fwd;
  fwd.deterministic = true;
  AttentionSpec atomic = fwd;
  atomic.direction = Direction::Backward;
  atomic.deterministic = false;
  AttentionSpec det = atomic;
  det.deterministic = true;
  EXPECT_EQ(attnModuleText(fwd, "k").find("deterministic"), std::string::npos);
  EXPECT_EQ(attnModuleText(atomic, "k").find("deterministic"),
            std::string::npos);
  EXPECT_NE(attnModuleText(det, "k").find("deterministic = true"),
            std::string::npos);
  EXPECT_NE(atomic.name(), det.name());
  EXPECT_EQ(fwd.toJson().find("deterministic"), std::string::npos);
  EXPECT_NE(atomic.toJson().find("\"deterministic\":false"), std::string::npos);
  EXPECT_NE(det.toJson().find("\"deterministic\":true"), std::string::npos);
  EXPECT_EQ(dqAccumulation(atomic), DqAccumulation::Atomic);
  EXPECT_EQ(dqAccumulation(det), DqAccumulation::SeparatePass);
}

TEST(Layout, DenseToBcsrAndBroadcast) {
  // 2 heads, 2x3 blocks.
  std::vector<uint8_t> dense = {1, 0, 1, 0, 0, 0, //
                                0, 1, 1, 1, 1, 1};
  auto l = BlockSparseLayout::fromDense(1, 2, 2, 3, dense);
  EXPECT_EQ(l.counts, (std::vector<int32_t>{2, 0, 2, 3}));
  EXPECT_TRUE(l.contains(0, 0, 0, 2));
  EXPECT_FALSE(l.contains(0, 0, 0, 1));
  EXPECT_FALSE(l.contains(0, 0, 1, 0));
  EXPECT_TRUE(l.contains(5, 1, 1, 0)); // batch 1 broadcasts
  EXPECT_EQ(l.countStrides()[0], 0);
  EXPECT_EQ(l.countStrides()[1], 2);
  EXPECT_NEAR(l.density(), 7.0 / 12.0, 1e-12);
  Problem p;
  p.batch = 3;
  p.heads = 2;
  p.seqLenQ = 100;
  p.seqLenKV = 130;
  EXPECT_NO_THROW(l.checkFits(p, 64));
  p.heads = 4;
  EXPECT_THROW(l.checkFits(p, 64), SpecError);
}

TEST(Layout, ReadsTextAndRejectsGarbage) {
  std::string path = ::testing::TempDir() + "/layout.txt";
  { std::ofstream(path) << "# two q blocks\n1 0 1\n0 1 0\n"; }
  auto l = BlockSparseLayout::readText(path);
  EXPECT_EQ(l.qBlocks, 2);
  EXPECT_EQ(l.kvBlocks, 3);
  EXPECT_EQ(l.counts, (std::vector<int32_t>{2, 1}));
  // 2: listed as full (abi::fullBlockEntry), ~1 for KV block 1.
  { std::ofstream(path) << "1 0\n1 2\n"; }
  l = BlockSparseLayout::readText(path);
  EXPECT_EQ(l.counts, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(l.indices[2], 0);
  EXPECT_EQ(l.indices[3], ~1);
  EXPECT_TRUE(l.contains(0, 0, 1, 1));
  { std::ofstream(path) << "1 0\n1 3\n"; }
  EXPECT_THROW(BlockSparseLayout::readText(path), SpecError);
  { std::ofstream(path) << "1 0\n1\n"; }
  EXPECT_THROW(BlockSparseLayout::readText(path), SpecError);
  EXPECT_THROW(BlockSparseLayout::readText(path + ".missing"), SpecError);
}

/// The reference itself, on a case with a closed form: all keys equal, so
/// every visible key gets the same weight and O is the mean of visible V.
TEST(Reference, UniformScoresAverageTheVisibleValues) {
  AttentionSpec spec;
  spec.headDimQK = 4;
  spec.headDimV = 3;
  spec.mask = MaskKind::Causal;
  Problem p;
  p.seqLenQ = p.seqLenKV = 5;
  std::mt19937_64 rng(std::random_device{}());
  AttentionData d = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
  for (auto &x : *d.k.buffer)
    x = floatToBf16(0.5f);
  auto ref = referenceForward(spec, p, d, nullptr);
  ASSERT_EQ(ref.rows.size(), 5u);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t c = 0; c < 3; ++c) {
      double mean = 0;
      for (int64_t j = 0; j <= i; ++j)
        mean += bf16ToFloat(d.v.at(0, 0, j, c));
      EXPECT_NEAR(ref.o[i * 3 + c], mean / double(i + 1), 1e-12);
    }
}

cli::CliOptions parse(std::vector<const char *> args) {
  args.insert(args.begin(), "flashjit");
  return cli::parseCommandLine(int(args.size()), args.data());
}

TEST(CliOptions, ParsesTheSpecProblemAndTiling) {
  auto o = parse({"run",       "--head-dim", "72",        "--head-dim-v=40",
                  "--dtype",   "fp16",       "--window",  "16,0",
                  "--gqa",     "2",          "--heads",   "4",
                  "--seq-len", "333",        "--block-m", "32",
                  "--block-n", "16",         "--device",  "cpu",
                  "--json"});
  EXPECT_EQ(o.command, "run");
  EXPECT_EQ(o.spec.headDimQK, 72);
  EXPECT_EQ(o.spec.headDimV, 40);
  EXPECT_EQ(o.spec.dtype, DType::FP16);
  EXPECT_EQ(o.spec.mask, MaskKind::SlidingWindow);
  EXPECT_EQ(o.problem.windowLeft, 16);
  EXPECT_EQ(o.problem.windowRight, 0);
  EXPECT_EQ(o.problem.seqLenKV, 333);
  EXPECT_EQ(o.config.blockM, 32);
  EXPECT_TRUE(o.json);
  EXPECT_EQ(o.device, cli::Device::Cpu);
}

TEST(CliOptions, RejectsBadInputWithANamedError) {
  auto expectError = [](std::vector<const char *> args, const char *needle) {
    try {
      parse(args);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const SpecError &e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << e.what();
    }
  };
  expectError({"run", "--bogus"}, "unknown option '--bogus'");
  expectError({"frobnicate"}, "unknown command");
  expectError({"run", "--head-dim", "0"}, "head_dim_qk");
  expectError({"run", "--head-dim", "600"}, "head_dim_qk");
  expectError({"run", "--head-dim", "abc"}, "expected an integer");
  expectError({"run", "--window", "-1,3"}, "window must be non-negative");
  expectError({"run", "--window", "5"}, "expected L,R");
  expectError({"run", "--block-sparse", "0.5", "--block-m", "48"},
              "block_m (48) must divide sparse_block (128)");
  expectError({"run", "--seq-len"}, "needs a value");
  expectError({"run", "--dtype", "fp32"}, "expected bf16 or fp16");
  expectError({"run", "--causal", "--window", "1,1"}, "exclusive");
  expectError({"run", "--scale", "-0.5"}, "scale must be finite and >= 0");
  for (const char *command : {"run", "bench", "tune", "compile"})
    expectError({command, "--deterministic"},
                "--deterministic needs --backward");
}

/// --deterministic picks the backward's separate dQ pass (default: atomic),
/// for every command that takes --backward; --help names it.
TEST(CliOptions, DeterministicBackward) {
  for (const char *command : {"run", "bench", "tune", "compile"}) {
    EXPECT_FALSE(parse({command, "--backward"}).spec.deterministic);
    auto o = parse({command, "--deterministic", "--backward"});
    EXPECT_EQ(o.spec.direction, Direction::Backward);
    EXPECT_TRUE(o.spec.deterministic) << command;
    EXPECT_NE(cli::helpText(command).find("--deterministic"), std::string::npos)
        << command;
  }
}

/// The tiling's switches alone (--overlap-softmax, --persistent,
/// --query-tma, --output-tma) make the config the flags' but mark it as
/// switches only, which the GPU commands apply to the device's default
/// tiling (withTilingSwitches); with any number of the tiling they are
/// part of a config that is wholly the flags'. --output-tma sets Q's map
/// too.
TEST(CliOptions, TilingSwitchesAloneSwitchTheDefault) {
  auto o = parse({"run", "--head-dim", "96", "--output-tma"});
  EXPECT_TRUE(o.configFromFlags);
  EXPECT_TRUE(o.tilingSwitchesOnly);
  EXPECT_TRUE(o.config.queryByTensorMap && o.config.outputByTensorMap);
  for (const char *number :
       {"--block-m", "--block-n", "--warps", "--stages", "--kv-splits"}) {
    auto n = parse({"run", "--head-dim", "96", "--persistent", number, "2"});
    EXPECT_TRUE(n.configFromFlags) << number;
    EXPECT_FALSE(n.tilingSwitchesOnly) << number;
  }
  EXPECT_FALSE(parse({"run", "--head-dim", "96"}).configFromFlags);
  TileConfig base;
  base.blockM = 192;
  base.warps = 12;
  TileConfig switched = cli::withTilingSwitches(base, o.config);
  EXPECT_EQ(switched.blockM, 192);
  EXPECT_EQ(switched.warps, 12);
  EXPECT_TRUE(switched.queryByTensorMap && switched.outputByTensorMap);
  EXPECT_FALSE(switched.persistent || switched.overlapSoftmax);
  TileConfig persistent = base;
  persistent.persistent = true; // a default's own switch stays on
  EXPECT_TRUE(cli::withTilingSwitches(persistent, o.config).persistent);
  // flagTiling: the device's default switched, the flags' whole config,
  // or none.
  EXPECT_EQ(cli::flagTiling(o, base)->toJson(), switched.toJson());
  auto numbers =
      parse({"run", "--head-dim", "96", "--output-tma", "--warps", "4"});
  EXPECT_EQ(cli::flagTiling(numbers, base)->toJson(), numbers.config.toJson());
  EXPECT_FALSE(
      cli::flagTiling(parse({"run", "--head-dim", "96"}), base).has_value());
  auto overlap = parse({"run", "--overlap-softmax", "--persistent"});
  switched = cli::withTilingSwitches(base, overlap.config);
  EXPECT_TRUE(switched.overlapSoftmax && switched.persistent);
  EXPECT_FALSE(switched.queryByTensorMap);
}

/// Large problems check an even sample of rows, always the first and last.
TEST(Reference, SamplesRowsOfLargeProblems) {
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = 8;
  Problem p;
  p.batch = 3;
  p.heads = 4;
  p.seqLenQ = p.seqLenKV = 1000;
  std::mt19937_64 rng(std::random_device{}());
  AttentionData d = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
  auto ref = referenceForward(spec, p, d, nullptr, /*maxWork=*/4 * 50 * 16000);
  EXPECT_EQ(ref.rows.size(), 4u * 50u);
  EXPECT_EQ(ref.rows.front(), 0);
  EXPECT_EQ(ref.rows.back(), 3 * 4 * 1000 - 1);
  auto full = referenceForward(spec, p, d, nullptr);
  EXPECT_EQ(full.rows.size(), 12000u);
  // The sampled rows carry the same values as the full reference.
  for (size_t ri = 0; ri < ref.rows.size(); ++ri)
    EXPECT_EQ(ref.lse[ri], full.lse[size_t(ref.rows[ri])]);
}

} // namespace
