//===- GpuDefaults.h - The default GPU tilings, before tuning ---*- C++ -*-===//
//
/// \file
/// The tilings the GPU forward and backward take without tuning (and that
/// the tuner starts from), per range of head dims, as measured on the H200
/// (bench/NOTES.md gives the runs). Plain C++, shared by compiler, runtime
/// and tools.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_KERNELS_GPUDEFAULTS_H
#define FLASHJIT_KERNELS_GPUDEFAULTS_H

#include "kernels/AttentionSpec.h"
#include "kernels/GpuGeometry.h"

#include <algorithm>
#include <optional>

namespace flashjit {

/// The default GPU tiling for a head dim (before tuning): the fastest
/// spill-free config measured on the H200 (bench/NOTES.md, sweep) per range
/// of max(head_dim_qk, head_dim_v). Two 16-row MMA tiles per warp where the
/// registers allow, so that each K/V fragment feeds two MMAs. With
/// \p warpgroupMma (the target runs the products on warpgroup MMAs where
/// the tiles allow: sm_90a) and head dims up to 256, the fastest spill-free
/// warpgroup tiling measured on the H200 instead (bench/NOTES.md, T6): one
/// 16-row tile per warp, a warpgroup per 64 rows. With \p kvRing as well
/// (usesKvRing), the same but where a K/V ring measured faster
/// (bench/NOTES.md, T10, T12, T13, T15; the tables below say where).
inline TileConfig defaultGpuConfig(const AttentionSpec &spec,
                                   bool warpgroupMma = false,
                                   bool kvRing = false) {
  struct Row {
    int64_t maxD, blockM, blockN, warps, stages = 2;
    bool overlapSoftmax = false;
    bool persistent = false; ///< with Q by its tensor map too
  };
  // Masks and block-sparse layouts keep a few more values live.
  const bool isPlain = spec.mask == MaskKind::None && !spec.blockSparse;
  const int64_t d = std::max(spec.headDimQK, spec.headDimV);
  // The tiling of the first row of \p plain or \p masked (by isPlain)
  // that covers d, if any.
  auto lookUp = [&](auto &plain, auto &masked) -> std::optional<TileConfig> {
    auto pick = [&](auto &rows) -> std::optional<TileConfig> {
      for (const Row &r : rows)
        if (d <= r.maxD) {
          TileConfig c;
          c.blockM = r.blockM;
          c.blockN = r.blockN;
          c.warps = r.warps;
          c.stages = r.stages;
          c.overlapSoftmax = r.overlapSoftmax;
          c.persistent = c.queryByTensorMap =
              r.persistent && !spec.varlen && spec.maskModRegion.empty() &&
              spec.direction == Direction::Forward;
          return c;
        }
      return std::nullopt;
    };
    return isPlain ? pick(plain) : pick(masked);
  };
  if (warpgroupMma) {
    static const Row plain[] = {
        {64, 64, 128, 4}, {128, 192, 128, 12}, {256, 128, 128, 8}};
    static const Row masked[] = {{128, 64, 128, 4}, {256, 128, 64, 8}};
    // With the ring (its K and V by tensor maps since T15): three
    // consumer warpgroups for d in 49..96 (T15, N = 16K: d = 64 causal
    // 393 -> 476 TFLOP/s, d = 96 442 -> 576; T13: d = 64 406 -> 453; at
    // d = 48 their producer spills 40 bytes), two at 128 x 128 for d in
    // 97..128 (T10; d = 96 causal as the masked d in 65..112, T15: 340 ->
    // 481), with the overlapped loop for d in 113..128, plain and masked
    // (T12; below, padded to 112, its consumers spill), and at 128 x 64
    // past d = 128 (T13: d = 256 causal 493 -> 542; T15, by tensor maps,
    // unmasked too: 520 -> 617); else the tilings above. Unmasked at d in
    // 113..128 (not varlen, no mask modifier) a persistent kernel with Q by its
    // tensor map (T31, H100s, against one tile per program in one run: N = 1024
    // B = 16 +11-13%, N = 4096 B = 4 +3-4.5%, N = 16K +9% in one call and
    // -5% in another, even within the cards' spread; causal it lost
    // 12-28%, at d = 64, 96 and 256 it gained nothing). Past d = 128 the
    // 128 x 64 tiling takes the overlapped loop too (T34, H200, N 16K,
    // against it without in one run: d = 256 +11.8%, causal +7.7%; 168
    // registers, no spill, at d = 144..256, dqk != dv and windows). There
    // Bc = 80 (T37, H100, d = 256, N 16K, two rounds against Bc = 64 in one
    // call: +2.5%, causal +4.2%; Q and a two-stage ring of K and V take
    // 224 KiB at d = 256), or T34's 64 where the sparse block needs a
    // divisor.
    constexpr int64_t kWideBc = 80, kWideBcSparse = 64;
    static const Row ringPlain[] = {{48, 64, 128, 4},
                                    {96, 192, 128, 12, 2},
                                    {112, 128, 128, 8, 2},
                                    {128, 128, 128, 8, 2, true, true},
                                    {256, 128, kWideBc, 8, 2, true}};
    static const Row ringMasked[] = {{48, 64, 128, 4},
                                     {64, 192, 128, 12, 2},
                                     {112, 128, 128, 8, 2},
                                     {128, 128, 128, 8, 2, true},
                                     {256, 128, kWideBc, 8, 2, true}};
    // A score modifier keeps T10's, but for the overlapped loop at d in
    // 113..128: T12's form spilled with one (ALiBi, causal: 96 bytes);
    // FlashAttention-3's order, peeled (T29, T30), holds softcap and ALiBi,
    // plain and causal, in the consumers' 240 registers without a spill.
    static const Row modPlain[] = {{64, 64, 128, 4},
                                   {96, 192, 128, 12, 1},
                                   {112, 128, 128, 8, 2},
                                   {128, 128, 128, 8, 2, true},
                                   {256, 128, 128, 8, 1}};
    static const Row modMasked[] = {{112, 64, 128, 4},
                                    {128, 128, 128, 8, 2, true},
                                    {256, 128, 64, 8, 1}};
    std::optional<TileConfig> c = !kvRing ? lookUp(plain, masked)
                                  : spec.scoreMod.empty()
                                      ? lookUp(ringPlain, ringMasked)
                                      : lookUp(modPlain, modMasked);
    // Br and Bc must divide the sparse block (192 never does): else the
    // tilings without the ring, else the generic one.
    auto divides = [&](const std::optional<TileConfig> &t) {
      return t && (!spec.blockSparse || (spec.sparseBlock % t->blockM == 0 &&
                                         spec.sparseBlock % t->blockN == 0));
    };
    if (!divides(c) && c && c->blockN == kWideBc)
      c->blockN = kWideBcSparse;
    if (!divides(c) && kvRing)
      c = lookUp(plain, masked);
    if (divides(c))
      return *c;
  }
  static const Row plain[] = {{32, 128, 128, 4}, {88, 128, 64, 4},
                              {112, 128, 32, 4}, {128, 128, 64, 4},
                              {256, 64, 64, 4},  {512, 64, 32, 4}};
  static const Row masked[] = {{16, 128, 128, 4},
                               {80, 128, 64, 4},
                               {128, 128, 32, 4},
                               {256, 64, 64, 4},
                               {512, 64, 32, 4}};
  TileConfig c = lookUp(plain, masked).value_or(TileConfig());
  if (spec.blockSparse) {
    // Br and Bc must divide the sparse block; fewer warps where Br shrinks.
    while (spec.sparseBlock % c.blockM != 0 && c.blockM > 16) {
      c.blockM /= 2;
      c.warps = std::min(c.warps, c.blockM / 16);
    }
    while (spec.sparseBlock % c.blockN != 0 && c.blockN > 16)
      c.blockN /= 2;
  }
  return c;
}

/// The default GPU tiling of the backward (before tuning), per range of
/// max(head_dim_qk, head_dim_v): one 16-key tile per warp in the dK/dV
/// kernel and one or two 16-row tiles per warp in the dQ kernel. Measured on
/// the H200 (bench/NOTES.md, `tune --backward` at N = 16K). Separate dQ
/// pass: 128 x 64 is 14% faster than 64 x 64 at d = 64 without a mask (with
/// one, its dK/dV kernel spills); 64 x 64 is the fastest at d = 128. Atomic
/// dQ: Bc = 128 with 8 warps (half the dq_accum traffic of Bc = 64) up to
/// d = 128 (64 x 128: 257 TFLOP/s at d = 128, 4-6% above 64 x 64; 128 x 128
/// at d = 64 without a mask), the same as the separate pass above.
inline TileConfig defaultGpuBackwardConfig(const AttentionSpec &spec) {
  int64_t d = std::max(spec.headDimQK, spec.headDimV);
  bool isPlain = spec.mask == MaskKind::None && !spec.blockSparse;
  bool atomic = dqAccumulation(spec) == DqAccumulation::Atomic;
  TileConfig c;
  if (atomic && d <= 128) {
    c.blockM = d <= 64 && isPlain ? 128 : 64;
    c.blockN = 128;
    c.warps = 8;
  } else if (d <= 64 && isPlain) {
    c.blockM = 128;
    c.blockN = 64;
    c.warps = 4;
  } else if (d <= 256) {
    c.blockM = 64;
    c.blockN = 64;
    c.warps = 4;
  } else {
    c.blockM = 32;
    c.blockN = 32;
    c.warps = 2;
  }
  if (spec.blockSparse) {
    // Br and Bc must divide the sparse block; fewer warps where they shrink.
    while (spec.sparseBlock % c.blockM != 0 && c.blockM > 16)
      c.blockM /= 2;
    while (spec.sparseBlock % c.blockN != 0 && c.blockN > 16)
      c.blockN /= 2;
    // (With atomic dQ only the keys are split over the warps.)
    while (c.warps > 1 && ((!atomic && c.blockM % (16 * c.warps) != 0) ||
                           c.blockN % (16 * c.warps) != 0))
      c.warps /= 2;
  }
  return c;
}

} // namespace flashjit

#endif // FLASHJIT_KERNELS_GPUDEFAULTS_H
