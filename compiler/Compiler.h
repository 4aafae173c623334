//===- Compiler.h - flashjit's compiler, as the tools see it ----*- C++ -*-===//
//
/// \file
/// The entry points of the compiler for the CLI, the tests and (later) the C
/// API: print any stage of the pipeline, and compile a kernel for the CPU
/// execution mode. No MLIR headers here: including this is cheap.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_COMPILER_H
#define FLASHJIT_COMPILER_COMPILER_H

#include "kernels/AttentionSpec.h"
#include "kernels/HostTensor.h"
#include "kernels/KernelLaunch.h"

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashjit {

/// The pipeline failed (a verifier or pass error); the message holds the
/// diagnostics. The CLI reports it and exits 2.
class CompileError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Inspectable stages of the pipeline.
enum class Stage {
  Attn,    ///< the attn dialect description
  Tile,    ///< after the tiling passes: the FA-2 loop in the tile dialect
  Gpu,     ///< the tensor-core kernel in the gpu + llvm/nvvm dialects
  Llvm,    ///< the kernel's LLVM IR (NVPTX), optimised
  Ptx,     ///< PTX assembly
  Cubin,   ///< the cubin (made by the caller from Ptx through nvJitLink)
  CpuLlvm, ///< LLVM IR of the CPU execution mode
};

/// Parses "attn", "tile" (or its old name "tiled"), "gpu", "llvm", "ptx",
/// "cubin", "cpu-llvm"; throws SpecError otherwise.
Stage parseStage(const std::string &name);

/// The IR a compile starts from: empty, the attn stage flashjit makes from
/// the spec; else the text of a file holding the attn stage or the tile
/// stage (an edit of `--emit tile`), which is compiled as it is.
struct KernelSource {
  std::string text;
  std::string name = "input"; ///< for diagnostics (the file's path)
  bool empty() const { return text.empty(); }
};

/// What an IR file holds.
struct SourceInfo {
  Stage stage = Stage::Attn; ///< Attn or Tile
  AttentionSpec spec;        ///< the description its op or #attn.kernel has
  /// The tile stage fixes Br and Bc (its #attn.kernel's block_m, block_n).
  std::optional<TileConfig> tiling;
};

/// Parses and verifies \p source, and reads the description it carries
/// (every kernel function of a tile-stage file must describe the same
/// attention). Throws CompileError for IR that does not parse or verify,
/// or that holds no kernel.
SourceInfo inspectSource(const KernelSource &source);

/// The forward of backward description \p backward (an attn stage holding
/// attn.flash_bwd): attn.flash_fwd with the same attributes (but
/// `deterministic`) and score_mod region, for the O and lse its backward
/// needs when the region is no named variant (a named one is rebuilt from
/// its name). Throws CompileError for another source.
KernelSource forwardSourceOf(const KernelSource &backward);

/// \p spec with the score modifier whose score_mod region is the text
/// \p region ("{ ^bb0(%s: f32, %b: index, %h: index, %i: index, %j:
/// index): ... attn.yield %y : f32 }", the region of attn.flash_fwd and
/// attn.flash_bwd): the named variant it is (softcap:C, alibi:H), or
/// "custom" with AttentionSpec::scoreModRegion (the region as MLIR prints
/// it) and its float64 evaluation (ScoreModText.cpp). Throws SpecError
/// naming what is wrong: text that does not parse, a region the verifier
/// refuses (signature, an op outside arith and math) or that cannot run on
/// tiles, more than 64 KiB.
AttentionSpec withScoreModRegion(const AttentionSpec &spec,
                                 const std::string &region);

/// \p spec with the mask modifier whose mask_mod region is the text
/// \p region ("{ ^bb0(%b: index, %h: index, %i: index, %j: index): ...
/// attn.yield %keep : i1 }"): AttentionSpec::maskModRegion, its float64
/// evaluation and its captured tensors (after the score_mod's). Throws
/// SpecError as withScoreModRegion.
AttentionSpec withMaskModRegion(const AttentionSpec &spec,
                                const std::string &region);

/// Whether \p spec's mask_mod region reads its batch and its head
/// argument ({false, false} without a region): a layout classified from a
/// mask that reads neither may broadcast over both (flashjit_mask_blocks,
/// `--mask-blocks`).
std::pair<bool, bool> maskModReadsBatchHead(const AttentionSpec &spec);

/// Both at once: \p scoreText ("" keeps \p spec's score modifier) and
/// \p maskText ("" for no mask modifier).
AttentionSpec withModifierRegions(const AttentionSpec &spec,
                                  const std::string &scoreText,
                                  const std::string &maskText);

/// What a GPU compile targets.
struct GpuTarget {
  std::string arch = "sm_90a"; ///< sm_80, sm_86, sm_89, sm_90, sm_90a, ...
  int driverVersion = 0;       ///< CUDA driver version (0: unknown)
  int64_t copyBytes = 16;      ///< global->shared copy width (alignment)
};

/// Names the code the compiler emits for a given pipeline text: part of
/// every cubin and tuning cache key, so that entries written by an earlier
/// code generator are rebuilt, not reused. Change it with every change to
/// a lowering that can alter the PTX of an unchanged pipeline.
inline constexpr const char *kCodegenRevision = "tile-ir-6";

/// The name the kernel function carries in every stage.
inline constexpr const char *kKernelName = "attention";

/// Prints \p stage (not Cubin) of \p spec compiled with \p config, from
/// \p source when given (whose description must be \p spec: see
/// inspectSource; a stage before the source's own is an error).
std::string emitStage(const AttentionSpec &spec, const TileConfig &config,
                      Stage stage, const GpuTarget &target = {},
                      const KernelSource &source = {});

/// The GPU kernels' PTX and the launch resources the lowering recorded on
/// each (kernels/KernelLaunch.h), which the launchers use.
struct GpuCompilation {
  std::string ptx;
  std::vector<KernelLaunch> kernels;
};

/// Compiles for the GPU; throws CompileError (or SpecError for a config
/// the GPU cannot run). Every kernel must record its resources.
GpuCompilation compileForGpu(const AttentionSpec &spec,
                             const TileConfig &config, const GpuTarget &target,
                             const KernelSource &source = {});

/// compileForGpu's launch resources alone (the GPU lowering without the
/// code generation).
std::vector<KernelLaunch> gpuKernelLaunches(const AttentionSpec &spec,
                                            const TileConfig &config,
                                            const GpuTarget &target,
                                            const KernelSource &source = {});

/// compileForGpu's PTX.
std::string compileToPtx(const AttentionSpec &spec, const TileConfig &config,
                         const GpuTarget &target,
                         const KernelSource &source = {});

/// The textual pass pipeline that takes the attn stage to the CPU's LLVM
/// dialect (the same one flashjit-opt runs as flashjit-cpu-pipeline).
std::string cpuPipelineText(const TileConfig &config);

/// The textual pass pipeline of the GPU kernel (as flashjit-opt runs it);
/// part of the cubin cache key. \p spec, where given, takes part in the
/// options' defaults that follow the description (exp2EmulationEighths).
std::string gpuPipelineText(const TileConfig &config, const GpuTarget &target,
                            const AttentionSpec *spec = nullptr);

/// Whether kernels for \p target add f32 pairs with one vector reduction
/// (red.global.add.v2.f32: sm_90 or later, PTX ISA 8.1 or later).
bool usesVectorAtomics(const GpuTarget &target);

/// Whether the backward's dK/dV kernel on warpgroup MMAs adds each step's
/// dQ tile into dq_accum by one bulk reduction from shared memory
/// (cp.reduce.async.bulk, the lowering's `bulk-dq` option) rather than by
/// each thread's red.global.add: opt-in with FLASHJIT_BULK_DQ=1 and
/// warpgroup MMAs (usesWgmma); measured 7% slower at d = 128 on the H200
/// (bench/NOTES.md, T24). The pipeline text, part of the cache key,
/// records it.
bool usesBulkDq(const GpuTarget &target);
/// The stages of the backward's Q/dO ring (the lowering's
/// `bwd-ring-stages`: a producer warpgroup copies Q and dO into an
/// mbarrier ring, the dK/dV kernel's two warpgroups only compute): opt-in
/// with FLASHJIT_BWD_RING=S (2 to 4) and warpgroup MMAs, else 0 (the
/// loop's double-buffered copies). Not yet run on a GPU (T27). The
/// pipeline text, part of the cache key, records it.
int64_t backwardRingStages(const GpuTarget &target);
/// Stages of the backward dK/dV kernel's own Q/dO pipeline (the
/// `bwd-stages` pass option; without the ring): 3 on warpgroup-MMA targets
/// (the default since T41; the placement keeps 2 where a third stage
/// does not fit the shared memory) unless FLASHJIT_BWD_STAGES=2, else 2.
/// The pipeline text, part of the cache key, records 3.
int64_t backwardStages(const GpuTarget &target);

/// Whether the backward's dK/dV kernel on warpgroup MMAs commits each
/// product apart and issues dQ before dK (the lowering's `split-commits`
/// option): on a warpgroup-MMA target unless FLASHJIT_BWD_SPLIT_COMMITS=0
/// (T33: 0-7% faster on an H100, every GPU backward suite passes). The
/// pipeline text, part of the cache key, records it.
bool usesSplitCommits(const GpuTarget &target);
/// Whether the backward's dK/dV kernel stores dK and dV through a dead
/// shared slot, 16 bytes a lane (the `bwd-staged-stores` pass option):
/// with 16-byte copies only; by default on warpgroup-MMA targets (T40),
/// FLASHJIT_BWD_STAGED_STORES=0 turns it off, =1 on for any target.
bool usesBackwardStagedStores(const GpuTarget &target);
/// Whether \p target runs the backward's dK/dV kernel on warpgroup MMAs
/// (wgmma.mma_async needs sm_90a): the pipeline's `wgmma` option.
bool usesWgmma(const GpuTarget &target);
/// Whether \p target's forward on warpgroup MMAs takes its K/V blocks
/// through the ring that a producer warpgroup fills (TileToGPURing.cpp;
/// config.stages deep for tilings of GpuGeometry::kRingConsumerWarps where
/// GpuGeometry::wgmmaShape holds): on sm_90a unless FLASHJIT_KV_RING=0.
bool usesKvRing(const GpuTarget &target);
/// With the K/V ring, how its consumer warpgroups take turns at the tensor
/// cores (the `ping-pong` pass option): FLASHJIT_PING_PONG's 0 (no order),
/// 1 (their S = Q K^T batches), 2 (every batch of MMAs in the ring loop) or
/// 3 (turns at the multi-function unit: each iteration's softmax);
/// unset, 3 for a causal forward (\p spec: no modifier, mask_mod or
/// block-sparse layout) on \p config's overlapped loop, 0 for the other
/// overlapped loops and for three consumer warpgroups, 1 otherwise; 0
/// without the ring.
int64_t pingPongMode(const GpuTarget &target, const TileConfig &config,
                     const AttentionSpec *spec = nullptr);
/// Whether the K/V ring's forward is a persistent kernel (the `persistent`
/// pass option: a grid of the device's SMs loops over the tiles): with the
/// ring, \p config's `persistent` unless FLASHJIT_PERSISTENT is 0 or 1;
/// off without the ring.
bool usesPersistentKernel(const GpuTarget &target, const TileConfig &config);
/// What the K/V ring's producer copies by the tensor memory accelerator
/// (the `tma` pass option; tensor maps that the launcher encodes from the
/// kernel's attn.tensor_maps): with the ring and 16-byte copies Q, K and V
/// (2) where \p config's `queryByTensorMap` asks, and O (3) where its
/// `outputByTensorMap` does, else K and V (1);
/// FLASHJIT_TMA=0, kv, qkv or qkvo overrides the config (0, 1, 2, 3: O
/// stored by its tensor map too, opt-in, bench/NOTES.md T36); nothing (0)
/// without the ring or 16-byte copies.
int64_t tensorMapMode(const GpuTarget &target, const TileConfig &config);
/// Whether the forward stores its 16-bit output through a shared slot that
/// is dead by then (16-byte vector stores of whole rows; the
/// `staged-stores` pass option): yes unless FLASHJIT_STAGED_STORES=0.
bool usesStagedStores();
/// Eighths (0..8) of the forward softmax's exponential tile that \p target
/// computes by arithmetic instead of ex2.approx (the `exp2-emulation` pass
/// option, TileToGPUExp2.cpp), on sm_90a with warpgroup MMAs (else 0):
/// FLASHJIT_EXP2_EMULATION's value where set (0..8; another value is 0);
/// else kSoftcapCausalExp2Eighths for the forward of a softcap with a
/// causal mask (\p spec; its tanh and exp2 share the multi-function unit,
/// and the causal rows leave the FMA pipe room: H100, three rounds, 2/8
/// ahead of 3/8 and of none; a sliding window of 4096 ran fastest with
/// none; the full forward loses 3-4%, bench/NOTES.md T35, T39-T41), else 0.
int64_t exp2EmulationEighths(const GpuTarget &target,
                             const AttentionSpec *spec = nullptr);
/// exp2EmulationEighths' default share for a causal softcap forward.
inline constexpr int64_t kSoftcapCausalExp2Eighths = 2;
/// Eighths (0..8) of the registers of a score tile's tanh (softcap's,
/// forward and backward) computed by a polynomial on the FMA pipe where
/// the warp's lie in [-1, 1], tanh.approx elsewhere (the `tanh-polynomial`
/// pass option, TileToGPUTanh.cpp, kernels/TanhPolynomial.h), so that the
/// multi-function unit has less to do: FLASHJIT_TANH_POLYNOMIAL's value
/// where set (0..8; another value is 0), else 0 (an H100 ran softcap's
/// forward 10% slower with all eight, its backward no faster: T44-3).
int64_t tanhPolynomialEighths();

/// A kernel compiled for the CPU execution mode (MLIR's ExecutionEngine).
class CpuKernel {
public:
  /// Compiles the forward \p spec with \p config; throws CompileError (or
  /// SpecError for a backward spec: see CpuBackwardKernel).
  static std::unique_ptr<CpuKernel> compile(const AttentionSpec &spec,
                                            const TileConfig &config,
                                            const KernelSource &source = {});
  ~CpuKernel();

  /// Runs every program of the grid (ceil(Nq / Br) x B*H) on host threads;
  /// a split-KV config (TileConfig::splits) runs the partial over its
  /// splits (the config's, or chooseKvSplits' for the host's threads) and
  /// then the combine (kernels/KernelABI.h, abi::split). \p layout is
  /// required iff the spec is block-sparse.
  void run(const Problem &problem, AttentionData &data,
           const BlockSparseLayout *layout) const;

  /// The layout of the spec's mask_mod region for \p problem (the spec
  /// block-sparse with a mask_mod; else SpecError): its classification
  /// function `@f_blocks` (kernels/KernelABI.h abi::blocks) evaluates the
  /// mask, with \p data's captured tensors, on every block pair. \p batch
  /// and \p heads: the layout's (the problem's, or 1 for a mask that does
  /// not depend on them, evaluated at 0). Varlen: a row per sequence
  /// (batch the problem's), each sequence's blocks from \p data's offsets
  /// (cuSeqQ, cuSeqKV; nothing else of data but the captured tensors is
  /// read). Entries past a count hold the classes the lists were compacted
  /// from (abi::blocks).
  BlockSparseLayout classifyBlocks(const Problem &problem,
                                   const AttentionData &data, int64_t batch,
                                   int64_t heads) const;

  const AttentionSpec &spec() const;
  const TileConfig &config() const;

private:
  struct Impl;
  explicit CpuKernel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl;
};

/// The backward pass compiled for the CPU execution mode: three functions
/// (kernels/KernelABI.h, abi::bwd): the preprocessing D = rowsum(dO * O), the
/// main loop (one program per KV block: dK, dV) and the dQ step (one program
/// per Q block). dQ by dqAccumulation(spec): Atomic, the main loop adds into
/// the f32 dq_accum workspace on host threads and the dQ step converts it;
/// SeparatePass (spec.deterministic), the dQ step is a separate pass,
/// bit-identical run to run.
class CpuBackwardKernel {
public:
  /// Compiles \p spec (direction Backward) with \p config; throws
  /// CompileError, or SpecError for a forward spec.
  static std::unique_ptr<CpuBackwardKernel>
  compile(const AttentionSpec &spec, const TileConfig &config,
          const KernelSource &source = {});
  ~CpuBackwardKernel();

  /// dq, dk, dv of \p grads from q, k, v, o, lse of \p fwd (the forward's
  /// outputs: O in the element type, lse f32) and grads.dO. Runs the three
  /// grids on host threads. \p workspace, if given, must hold
  /// backwardWorkspaceBytes(spec, problem) bytes (delta, and dq_accum for
  /// atomic dQ), in any state; else the kernel allocates it. \p layout is
  /// required iff the spec is block-sparse; its KV-major transpose is derived
  /// here.
  void run(const Problem &problem, const AttentionData &fwd,
           AttentionGrads &grads, const BlockSparseLayout *layout,
           void *workspace = nullptr, int64_t workspaceBytes = 0) const;

  const AttentionSpec &spec() const;
  const TileConfig &config() const;

private:
  struct Impl;
  explicit CpuBackwardKernel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl;
};

} // namespace flashjit

#endif // FLASHJIT_COMPILER_COMPILER_H
