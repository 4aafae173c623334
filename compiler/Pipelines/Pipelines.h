//===- Pipelines.h - flashjit's pass pipelines ------------------*- C++ -*-===//
//
/// \file
/// The pipelines, assembled once in C++ and registered by name, so that the
/// JIT, the tests and flashjit-opt run exactly the same passes.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_PIPELINES_PIPELINES_H
#define FLASHJIT_COMPILER_PIPELINES_PIPELINES_H

#include "kernels/AttentionSpec.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

namespace mlir {
class DialectRegistry;
}

namespace flashjit {

/// GPU-only knobs of the GPU pipeline.
struct GpuPipelineConfig {
  int64_t copyBytes = 16;     ///< global -> shared copy width (alignment)
  bool vectorAtomics = false; ///< red.global.add.v2.f32 (sm_90, PTX 8.1)
  bool wgmma = false;         ///< warpgroup MMAs (sm_90a)
  /// The warpgroup-MMA forward's K/V ring stages (0 or 1: no ring).
  int64_t kvRingStages = 0;
  /// The ring's consumer warpgroups in turn at the tensor cores (0: no
  /// order; 1: their S = Q K^T batches; 2: every batch of the loop).
  int64_t pingPong = 0;
  /// The ring's forward as a persistent kernel (tiles looped over by a
  /// grid of the device's SMs).
  bool persistent = false;
  /// The ring's K and V (1), and Q (2), by the tensor memory accelerator
  /// (tensor maps).
  int64_t tma = 0;
  /// The forward's output tile through a dead shared slot (16-byte stores).
  bool stagedStores = true;
  /// Eighths of the forward softmax's exponentials by arithmetic (0..8).
  int64_t exp2Emulation = 0;
  /// The backward's atomic dQ by one bulk reduction per step (wgmma).
  bool bulkDq = false;
  /// The backward's dK/dV kernel: a Q/dO ring of this many stages filled
  /// by a producer warpgroup (wgmma; 0: the loop's own copies).
  int64_t bwdRingStages = 0;
};

/// The GPU lowering's options, one set for every registered pipeline that
/// runs it (\p Derived: that pipeline's options), and gpuConfig(), the same
/// knobs as the C++ builders take them.
template <typename Derived>
struct GpuLoweringOptions : public mlir::PassPipelineOptions<Derived> {
  template <typename T> using Option = mlir::detail::PassOptions::Option<T>;

  Option<int64_t> warps{*this, "warps",
                        llvm::cl::desc("warps per thread block (GPU)"),
                        llvm::cl::init(4)};
  Option<int64_t> copyBytes{
      *this, "copy-bytes",
      llvm::cl::desc("global->shared copy width in bytes (GPU)"),
      llvm::cl::init(16)};
  Option<bool> vectorAtomics{
      *this, "vector-atomics",
      llvm::cl::desc("f32 pairs by red.global.add.v2.f32 (GPU; sm_90, PTX "
                     "ISA 8.1)"),
      llvm::cl::init(false)};
  Option<bool> wgmma{*this, "wgmma",
                     llvm::cl::desc("the products on warpgroup MMAs where the "
                                    "shape allows (sm_90a): the forward's and "
                                    "the backward's dK/dV kernel's"),
                     llvm::cl::init(false)};
  Option<int64_t> kvRingStages{
      *this, "kv-ring-stages",
      llvm::cl::desc("the warpgroup-MMA forward's K/V ring: its stages (2 to "
                     "4; 0 or 1: no ring)"),
      llvm::cl::init(0)};
  Option<int64_t> pingPong{
      *this, "ping-pong",
      llvm::cl::desc("the K/V ring's consumer warpgroups take turns at the "
                     "tensor cores: 0 no order, 1 S = Q K^T, 2 every batch"),
      llvm::cl::init(0)};
  Option<bool> persistent{
      *this, "persistent",
      llvm::cl::desc("the K/V ring's forward as a persistent kernel: a grid "
                     "of the device's SMs loops over the tiles"),
      llvm::cl::init(false)};
  Option<int64_t> tma{
      *this, "tma",
      llvm::cl::desc("the K/V ring's K and V (1), and Q too (2), by the "
                     "tensor memory accelerator (tensor maps at launch)"),
      llvm::cl::init(0)};
  Option<bool> stagedStores{
      *this, "staged-stores",
      llvm::cl::desc("the forward's output tile through a dead shared slot "
                     "(16-byte stores of whole rows)"),
      llvm::cl::init(true)};
  Option<int64_t> exp2Emulation{
      *this, "exp2-emulation",
      llvm::cl::desc("eighths (0 to 8) of the forward softmax's exponential "
                     "tile computed by arithmetic on the FMA pipe"),
      llvm::cl::init(0)};

  Option<bool> bulkDq{
      *this, "bulk-dq",
      llvm::cl::desc("the backward's dK/dV kernel on warpgroup MMAs adds "
                     "each step's dQ tile into dq_accum by one bulk "
                     "reduction from shared memory (cp.reduce.async.bulk, "
                     "sm_90)"),
      llvm::cl::init(false)};
  Option<int64_t> bwdRingStages{
      *this, "bwd-ring-stages",
      llvm::cl::desc("the backward's dK/dV kernel on warpgroup MMAs: a Q/dO "
                     "ring of this many stages filled by a producer "
                     "warpgroup (2 to 4; 0: the loop's own copies)"),
      llvm::cl::init(0)};

  GpuPipelineConfig gpuConfig() const {
    GpuPipelineConfig gpu;
    gpu.copyBytes = copyBytes;
    gpu.vectorAtomics = vectorAtomics;
    gpu.wgmma = wgmma;
    gpu.kvRingStages = kvRingStages;
    gpu.pingPong = pingPong;
    gpu.persistent = persistent;
    gpu.tma = tma;
    gpu.stagedStores = stagedStores;
    gpu.exp2Emulation = exp2Emulation;
    gpu.bulkDq = bulkDq;
    gpu.bwdRingStages = bwdRingStages;
    return gpu;
  }
};

/// Tuning knobs of a pipeline (pipeline options, never global flags): the
/// tiling's and the GPU lowering's.
struct FlashjitPipelineOptions
    : public GpuLoweringOptions<FlashjitPipelineOptions> {
  Option<int64_t> blockM{*this, "block-m",
                         llvm::cl::desc("Br: query rows per program"),
                         llvm::cl::init(64)};
  Option<int64_t> blockN{*this, "block-n",
                         llvm::cl::desc("Bc: keys per KV-loop iteration"),
                         llvm::cl::init(64)};
  Option<bool> kvSplit{
      *this, "kv-split",
      llvm::cl::desc("the split-KV forward: a partial per run of KV blocks "
                     "and their lse merge (flashjit-tile-attention's "
                     "kv-split)"),
      llvm::cl::init(false)};
  Option<bool> overlapSoftmax{
      *this, "overlap-softmax",
      llvm::cl::desc("the software-pipelined KV loop: S = Q K^T of block "
                     "t + 1 before the softmax of block t "
                     "(flashjit-tile-attention's overlap-softmax)"),
      llvm::cl::init(false)};
};

/// flashjit-tile-to-ptx-pipeline's options: the GPU lowering's (as
/// FlashjitPipelineOptions; the tiling is the IR's) and the PTX target's
/// (flashjit-gpu-module-to-ptx's). `flashjit compile --target sm_90a` with
/// no CUDA driver corresponds to chip=sm_90a wgmma=true, ptx-version 0.
struct FlashjitPtxPipelineOptions
    : public GpuLoweringOptions<FlashjitPtxPipelineOptions> {
  Option<std::string> chip{*this, "chip",
                           llvm::cl::desc("the GPU architecture (sm_80, "
                                          "sm_90a, ...)"),
                           llvm::cl::init("sm_90a")};
  Option<int64_t> ptxVersion{
      *this, "ptx-version",
      llvm::cl::desc("PTX ISA version times ten; 0: the chip's lowest"),
      llvm::cl::init(0)};
};

/// attn -> tiled IR (flashjit-tile-attention for attn.flash_fwd,
/// flashjit-tile-attention-backward for attn.flash_bwd, then cleanup).
void buildTilingPipeline(mlir::OpPassManager &pm, const TileConfig &config);

/// tile IR -> LLVM dialect for the host: flashjit-lower-tile-to-loops, then
/// the host lowering (LICM, SCF -> CF, memref / math / arith / index / func
/// / cf -> LLVM, canonicalize).
void buildCpuLoweringPipeline(mlir::OpPassManager &pm);

/// attn -> LLVM dialect for the host: the CPU execution mode (the tiling
/// pipeline, then buildCpuLoweringPipeline).
void buildCpuPipeline(mlir::OpPassManager &pm, const TileConfig &config);

/// attn -> gpu.module in the LLVM + NVVM dialects (tensor-core kernel),
/// ready for translation to LLVM IR and PTX: the tiling pipeline, then
/// buildGpuLoweringPipeline. Stops after the lowering to the gpu dialect
/// when \p stopAtGpu (the `gpu` stage).
void buildGpuPipeline(mlir::OpPassManager &pm, const TileConfig &config,
                      const GpuPipelineConfig &gpu, bool stopAtGpu = false);

/// tile IR -> gpu.module in the LLVM + NVVM dialects: the GPU lowering
/// (flashjit-lower-tiled-to-gpu with \p warps warps), cleanup and, unless
/// \p stopAtGpu, the conversion to NVVM.
void buildGpuLoweringPipeline(mlir::OpPassManager &pm, int64_t warps,
                              const GpuPipelineConfig &gpu,
                              bool stopAtGpu = false);

/// tile IR -> a gpu.binary holding the PTX: buildGpuLoweringPipeline, then
/// flashjit-gpu-module-to-ptx (compiler/Target/Passes.td), whose PTX is
/// `flashjit compile --input ... --emit ptx`'s for the same options.
void buildPtxLoweringPipeline(mlir::OpPassManager &pm,
                              const FlashjitPtxPipelineOptions &options);

/// Registers "flashjit-tiling-pipeline", "flashjit-cpu-pipeline",
/// "flashjit-tile-to-cpu-pipeline", "flashjit-gpu-pipeline",
/// "flashjit-tile-to-gpu-pipeline", "flashjit-tile-to-ptx-pipeline" and
/// every flashjit pass with the global pass registry (for flashjit-opt).
void registerFlashjitPasses();

/// Every dialect and interface the pipelines need.
void registerFlashjitDialects(mlir::DialectRegistry &registry);

} // namespace flashjit

#endif // FLASHJIT_COMPILER_PIPELINES_PIPELINES_H
