//===- PropertyTests.cpp - Random valid problems vs float64 ---------------===//
//
/// \file
/// A property test of the forward on the CPU (the tile IR, lowered to
/// loops): each run draws fresh random valid problems (head dims, dtype,
/// mask and window, GQA, batch and heads, sequence lengths with Nq != Nkv,
/// tilings that need not divide them, block-sparse layouts of every kind,
/// packed or separate q/k/v strides) and checks each against the float64
/// reference as the fixed matrix does. FLASHJIT_PROPERTY_SEED replays a
/// run; its seed is printed.
//
//===----------------------------------------------------------------------===//

#include "tests/unit/ForwardCheck.h"

#include <cstdio>
#include <cstdlib>
#include <string>

using namespace flashjit;
using namespace flashjit::test;

namespace {

/// One random valid case from \p rng.
Case drawCase(std::mt19937_64 &rng, std::string &name) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return lo + int64_t(rng() % uint64_t(hi - lo + 1));
  };
  Case c{};
  c.dqk = rng() % 4 == 0 ? pick(1, 512) : pick(1, 160);
  c.dv = rng() % 3 == 0 ? pick(1, 160) : c.dqk;
  c.dtype = rng() % 2 ? DType::BF16 : DType::FP16;
  static const MaskKind masks[] = {MaskKind::None, MaskKind::Causal,
                                   MaskKind::SlidingWindow};
  c.mask = masks[rng() % 3];
  c.gqa = pick(1, 3);
  c.batch = pick(1, 2);
  c.heads = c.gqa * pick(1, 2);
  c.nq = pick(1, 300);
  c.nkv = rng() % 2 ? c.nq : pick(1, 300);
  if (c.mask == MaskKind::SlidingWindow) {
    c.winL = pick(0, 80);
    c.winR = pick(0, 80);
  }
  static const int64_t tiles[] = {16, 32, 48, 64, 128};
  c.br = tiles[rng() % 5];
  c.bc = tiles[rng() % 5];
  if (rng() % 3 == 0) {
    static const LayoutKind kinds[] = {LayoutKind::Random, LayoutKind::EmptyRow,
                                       LayoutKind::Full};
    c.layout = kinds[rng() % 3];
    c.sparseBlock = rng() % 2 ? 64 : 128;
    // Br and Bc must divide the sparse block.
    while (c.sparseBlock % c.br)
      c.br /= 2;
    while (c.sparseBlock % c.bc)
      c.bc /= 2;
    c.br = std::max<int64_t>(c.br, 16);
    c.bc = std::max<int64_t>(c.bc, 16);
  }
  if (c.layout == LayoutKind::Dense && c.gqa == 1 && rng() % 4 == 0) {
    c.qkv = QKVLayout::Packed; // one (B, N, 3, H, d) buffer
    c.dv = c.dqk;
    c.nkv = c.nq;
  }
  name = "d" + std::to_string(c.dqk) + "_dv" + std::to_string(c.dv) +
         (c.dtype == DType::FP16 ? "_fp16" : "_bf16") + "_mask" +
         std::to_string(int(c.mask)) + "_w" + std::to_string(c.winL) + "," +
         std::to_string(c.winR) + "_g" + std::to_string(c.gqa) + "_b" +
         std::to_string(c.batch) + "_h" + std::to_string(c.heads) + "_nq" +
         std::to_string(c.nq) + "_nkv" + std::to_string(c.nkv) + "_" +
         std::to_string(c.br) + "x" + std::to_string(c.bc) + "_layout" +
         std::to_string(int(c.layout)) + "_sb" + std::to_string(c.sparseBlock) +
         (c.qkv == QKVLayout::Packed ? "_packed" : "");
  c.name = name.c_str();
  return c;
}

TEST(Property, RandomValidProblemsMatchFloat64) {
  const char *given = std::getenv("FLASHJIT_PROPERTY_SEED");
  uint64_t seed = given ? std::strtoull(given, nullptr, 10) : freshSeed();
  std::printf("property seed %llu\n", (unsigned long long)seed);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 24; ++i) {
    std::string name;
    Case c = drawCase(rng, name);
    SCOPED_TRACE(::testing::Message() << "case " << i << ": " << name
                                      << " (property seed " << seed << ")");
    expectForwardMatchesReference(c, rng());
    if (::testing::Test::HasFailure())
      return;
  }
}

} // namespace
