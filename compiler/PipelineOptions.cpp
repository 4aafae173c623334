//===- PipelineOptions.cpp - What each pipeline text and GPU option says --===//
//
/// \file
/// The textual pipelines (part of every cache key) and the GPU lowering's
/// options as the target and the FLASHJIT_* comparison switches give them
/// (compiler/Compiler.h declares each with its contract).
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "compiler/Pipelines/Pipelines.h"
#include "compiler/Target/PTXEmitter.h"

#include <cstdlib>
#include <fmt/format.h>
#include <string>

namespace flashjit {

/// " kv-split=true" for a split-KV tiling, " overlap-softmax=true" for the
/// pipelined loop, " bias-product=true", " dq-quad-order=true" and
/// " softmax-lead=2" where they are taken, else nothing (so that the other
/// pipelines' texts, and cache keys, stay as they were).
static std::string tilingOptions(const TileConfig &config) {
  return std::string(config.splits ? " kv-split=true" : "") +
         (config.overlapSoftmax ? " overlap-softmax=true" : "") +
         (usesBiasProduct(config) ? " bias-product=true" : "") +
         (usesDqQuadOrder() ? " dq-quad-order=true" : "") +
         (softmaxLead(config) == 2 ? " softmax-lead=2" : "");
}

std::string cpuPipelineText(const TileConfig &config) {
  return fmt::format("builtin.module(flashjit-cpu-pipeline{{block-m={} "
                     "block-n={}{}}})",
                     config.blockM, config.blockN, tilingOptions(config));
}

std::string gpuPipelineText(const TileConfig &config, const GpuTarget &target,
                            const AttentionSpec *spec) {
  const int64_t bwdRing = backwardRingStages(target);
  const int64_t tma = tensorMapMode(target, config);
  const int64_t exp2 = exp2EmulationEighths(target, spec);
  const int64_t tanhK = tanhPolynomialEighths();
  return fmt::format(
      "builtin.module(flashjit-gpu-pipeline{{block-m={} "
      "block-n={} warps={} copy-bytes={} vector-atomics={} wgmma={} "
      "kv-ring-stages={} ping-pong={}{}{}{}{}{}{}{}{}{}{}{}}})",
      config.blockM, config.blockN, config.warps, target.copyBytes,
      usesVectorAtomics(target), usesWgmma(target),
      usesKvRing(target) ? config.stages : 0,
      pingPongMode(target, config, spec),
      usesPersistentKernel(target, config) ? " persistent=true" : "",
      tma ? fmt::format(" tma={}", tma) : "",
      usesStagedStores() ? "" : " staged-stores=false",
      exp2 ? fmt::format(" exp2-emulation={}", exp2) : "",
      tanhK ? fmt::format(" tanh-polynomial={}", tanhK) : "",
      usesBulkDq(target) ? " bulk-dq=true" : "",
      bwdRing ? fmt::format(" bwd-ring-stages={}", bwdRing) : "",
      usesSplitCommits(target) ? " split-commits=true" : "",
      usesBackwardStagedStores(target) ? " bwd-staged-stores=true" : "",
      backwardStages(target) == 3 ? " bwd-stages=3" : "",
      tilingOptions(config));
}

int64_t exp2EmulationEighths(const GpuTarget &target,
                             const AttentionSpec *spec) {
  if (!usesWgmma(target))
    return 0;
  if (const char *env = std::getenv("FLASHJIT_EXP2_EMULATION")) {
    const std::string v = env;
    return v.size() == 1 && v[0] >= '0' && v[0] <= '8' ? v[0] - '0' : 0;
  }
  // A causal softcap forward only: three rounds on an H100 (T40, T41 x 2)
  // put 2/8 ahead of 3/8 and 0 there, and 0 ahead of 3/8 for a 4096 window.
  const bool causalSoftcap = spec && spec->direction == Direction::Forward &&
                             spec->scoreMod.rfind("softcap:", 0) == 0 &&
                             spec->mask == MaskKind::Causal;
  return causalSoftcap ? kSoftcapCausalExp2Eighths : 0;
}

int64_t tanhPolynomialEighths() {
  // Opt-in: on an H100 (T44-3) the polynomial on every register cost more
  // than the unit's tanh saved (softcap:30 forward 541 against 602
  // TFLOP/s). The pipeline text, part of the cache key, records it.
  const char *env = std::getenv("FLASHJIT_TANH_POLYNOMIAL");
  const std::string v = env ? env : "";
  return v.size() == 1 && v[0] >= '0' && v[0] <= '8' ? v[0] - '0' : 0;
}

bool usesStagedStores() {
  // FLASHJIT_STAGED_STORES=0 stores the forward's output element by element
  // (for comparisons); the pipeline text, part of the cache key, records it.
  const char *env = std::getenv("FLASHJIT_STAGED_STORES");
  return !(env && std::string(env) == "0");
}

bool usesPersistentKernel(const GpuTarget &target, const TileConfig &config) {
  // The config's choice (defaultGpuConfig: the plain d = 128 tiling, T31),
  // unless FLASHJIT_PERSISTENT says 0 or 1; the pipeline text, part of the
  // cache key, records it.
  if (!usesKvRing(target))
    return false;
  const char *env = std::getenv("FLASHJIT_PERSISTENT");
  const std::string v = env ? env : "";
  return v == "1" || (v != "0" && config.persistent);
}

int64_t tensorMapMode(const GpuTarget &target, const TileConfig &config) {
  // Tensor maps want 16-byte aligned addresses and strides: the 16-byte
  // copies' (the launcher picks the copy width from the tensors).
  if (!usesKvRing(target) || target.copyBytes != 16)
    return 0;
  const char *env = std::getenv("FLASHJIT_TMA");
  const std::string v = env ? env : "";
  if (v == "0" || v == "kv" || v == "qkv" || v == "qkvo")
    return v == "0" ? 0 : v == "kv" ? 1 : v == "qkv" ? 2 : 3;
  // Q by the producer too (2) where the config asks (defaultGpuConfig: with
  // the persistent kernel at d = 128, T31; one tile per program it measured
  // no faster on the H200, T17); else K and V. O by its map too (3) where
  // the config asks (T36: opt-in).
  return config.outputByTensorMap ? 3 : config.queryByTensorMap ? 2 : 1;
}

int64_t pingPongMode(const GpuTarget &target, const TileConfig &config,
                     const AttentionSpec *spec) {
  if (!usesKvRing(target))
    return 0;
  const char *env = std::getenv("FLASHJIT_PING_PONG");
  const std::string v = env ? env : "";
  if (v == "0" || v == "1" || v == "2" || v == "3")
    return v[0] - '0';
  // Turns at the multi-function unit for a causal forward on the
  // overlapped loop without a modifier (H200, T43: three rounds, N 16K
  // +2.5%, 8192 +3.5%, 4096 x 4 +3%, 1024 x 16 +0.5-1%; H100, T42: N 8192
  // +3%); without the mask they cost 3.5% (T42), with softcap they gain
  // nothing.
  if (spec && spec->direction == Direction::Forward &&
      spec->mask == MaskKind::Causal && spec->scoreMod.empty() &&
      spec->maskModRegion.empty() && !spec->blockSparse &&
      config.overlapSoftmax && !config.splits)
    return 3;
  // No turns where they were measured to hold the consumers back
  // (bench/NOTES.md, T30): the overlapped loop, which runs its softmax
  // under its own MMAs (H100: N 1024 B 16 +2-5%, N 4096 B 4 +3% without
  // them), and three consumer warpgroups (H200, N 16K: d 64 and 96 +3%);
  // turns stay where the plain loop's two warpgroups gain by them (d 256:
  // -3% without).
  return config.overlapSoftmax || config.warps >= 12 ? 0 : 1;
}

bool usesKvRing(const GpuTarget &target) {
  // FLASHJIT_KV_RING=0 keeps every forward's own copies (for comparisons);
  // the pipeline text, part of the cache key, records the choice.
  const char *env = std::getenv("FLASHJIT_KV_RING");
  return usesWgmma(target) && !(env && std::string(env) == "0");
}

bool usesWgmma(const GpuTarget &target) {
  // FLASHJIT_WGMMA=0 keeps mma.sync (for comparisons); the pipeline text,
  // part of the cache key, records the choice.
  const char *env = std::getenv("FLASHJIT_WGMMA");
  return target.arch == "sm_90a" && !(env && std::string(env) == "0");
}

bool usesBulkDq(const GpuTarget &target) {
  // Not with dq_accum in quad order: the staging tile's rows are in column
  // order (the threads' reductions take quad order).
  const char *env = std::getenv("FLASHJIT_BULK_DQ");
  return usesWgmma(target) && env && std::string(env) == "1" &&
         !usesDqQuadOrder();
}

bool usesBackwardStagedStores(const GpuTarget &target) {
  // On by default on warpgroup-MMA targets since T40 (H100, N 8192, d 128,
  // two rounds: plain -3.2%, causal -3.9%, window 1024 -12% backward time;
  // every backward GPU test, racecheck clean); FLASHJIT_BWD_STAGED_STORES=0
  // turns it off, =1 turns it on elsewhere too (never run on sm_80). The
  // pipeline text, part of the cache key, records it.
  if (target.copyBytes != 16)
    return false;
  const char *env = std::getenv("FLASHJIT_BWD_STAGED_STORES");
  if (env && (std::string(env) == "0" || std::string(env) == "1"))
    return env[0] == '1';
  return usesWgmma(target);
}

bool usesSplitCommits(const GpuTarget &target) {
  // On by default since T33 (H100, N 8192: d 128 +7.2%, causal +3.6%,
  // ALiBi +7.3%, softcap +6.3%, GQA 4 +4.8%, d 96 +1.3%, d 64 +0%);
  // FLASHJIT_BWD_SPLIT_COMMITS=0 turns it off (for comparisons).
  const char *env = std::getenv("FLASHJIT_BWD_SPLIT_COMMITS");
  return usesWgmma(target) && !(env && std::string(env) == "0");
}

int64_t backwardStages(const GpuTarget &target) {
  // Three by default on warpgroup-MMA targets since T41 (the dK/dV step
  // waited on its Q/dO copies for 14% of its stall samples, ncu T40; H100,
  // N 8192, d 128, two rounds: plain -0.6%, causal -2.6%, window 1024
  // -2.5%); FLASHJIT_BWD_STAGES=2 keeps two (for comparisons). The
  // placement keeps two where a third does not fit.
  const char *env = std::getenv("FLASHJIT_BWD_STAGES");
  return usesWgmma(target) && !(env && std::string(env) == "2") ? 3 : 2;
}

int64_t backwardRingStages(const GpuTarget &target) {
  const char *env = std::getenv("FLASHJIT_BWD_RING");
  if (!usesWgmma(target) || !env)
    return 0;
  const int64_t stages = std::atoll(env);
  return stages >= 2 && stages <= 4 ? stages : 0;
}

bool usesVectorAtomics(const GpuTarget &target) {
  const std::string &arch = target.arch;
  int sm = 0;
  if (arch.rfind("sm_", 0) == 0)
    sm = std::atoi(arch.c_str() + 3);
  return sm >= 90 && choosePtxVersion(arch, target.driverVersion) >= 81;
}

} // namespace flashjit
