//===- Pipelines.h - flashjit's pass pipelines ------------------*- C++ -*-===//
//
/// \file
/// The pipelines, assembled once in C++ and registered by name, so that the
/// JIT, the tests and flashjit-opt run exactly the same passes.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_PIPELINES_PIPELINES_H
#define FLASHJIT_COMPILER_PIPELINES_PIPELINES_H

#include "compiler/Conversion/GpuLoweringConfig.h"
#include "kernels/AttentionSpec.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

namespace mlir {
class DialectRegistry;
}

namespace flashjit {

/// The GPU lowering's options, one set for every registered pipeline that
/// runs it (\p Derived: that pipeline's options): `warps` and each knob of
/// GpuLoweringKnobs.def under its flag, and gpuConfig(), the same knobs as
/// the C++ builders take them.
template <typename Derived>
struct GpuLoweringOptions : public mlir::PassPipelineOptions<Derived> {
  template <typename T> using Option = mlir::detail::PassOptions::Option<T>;

  Option<int64_t> warps{*this, "warps",
                        llvm::cl::desc("warps per thread block (GPU)"),
                        llvm::cl::init(4)};
#define FLASHJIT_GPU_KNOB(Type, Name, Flag, Default, Description)              \
  Option<Type> Name{*this, Flag, llvm::cl::desc(Description),                  \
                    llvm::cl::init(Default)};
#include "compiler/Conversion/GpuLoweringKnobs.def"

  GpuLoweringConfig gpuConfig() const {
    GpuLoweringConfig gpu;
#define FLASHJIT_GPU_KNOB(Type, Name, Flag, Default, Description)              \
  gpu.Name = Name;
#include "compiler/Conversion/GpuLoweringKnobs.def"
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
  Option<bool> biasProduct{
      *this, "bias-product",
      llvm::cl::desc("with overlap-softmax: an affine score bias as one more "
                     "step of Q K^T (flashjit-tile-attention's "
                     "bias-product)"),
      llvm::cl::init(false)};
  Option<bool> dqQuadOrder{
      *this, "dq-quad-order",
      llvm::cl::desc("atomic dQ: dq_accum's rows in quad order "
                     "(flashjit-tile-attention-backward's dq-quad-order)"),
      llvm::cl::init(false)};
  Option<int64_t> softmaxLead{
      *this, "softmax-lead",
      llvm::cl::desc("with overlap-softmax: 2 issues S = Q K^T two blocks "
                     "ahead of the softmax (flashjit-tile-attention's "
                     "softmax-lead)"),
      llvm::cl::init(1)};
};

/// flashjit-tile-to-ptx-pipeline's options: the GPU lowering's (as
/// FlashjitPipelineOptions; the tiling is the IR's) and the PTX target's
/// (flashjit-gpu-module-to-ptx's). `flashjit compile --target sm_90a` with
/// no CUDA driver corresponds to chip=sm_90a wgmma=true split-commits=true,
/// ptx-version 0.
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

/// Whether atomic dQ keeps dq_accum's rows in quad order (the backward
/// tiling's `dq-quad-order`, so the CPU and the GPU both): yes unless
/// FLASHJIT_DQ_QUAD_ORDER=0 (the default since T41). The pipeline texts,
/// part of the cache keys, record it.
bool usesDqQuadOrder();

/// How many blocks ahead of its softmax the overlapped loop issues a
/// block's S (the forward tiling's `softmax-lead`, so the CPU and the GPU
/// both): 2 where FLASHJIT_SOFTMAX_LEAD=2 and \p config takes the
/// overlapped loop (opt-in, T43: not yet timed), else 1. The pipeline
/// texts, part of the cache keys, record it.
int64_t softmaxLead(const TileConfig &config);

/// attn -> tiled IR (flashjit-tile-attention for attn.flash_fwd,
/// flashjit-tile-attention-backward for attn.flash_bwd, then cleanup);
/// \p dqQuadOrder: the backward tiling's `dq-quad-order`; \p lead: the
/// forward tiling's `softmax-lead` (0: softmaxLead(config)).
void buildTilingPipeline(mlir::OpPassManager &pm, const TileConfig &config,
                         bool dqQuadOrder = usesDqQuadOrder(),
                         int64_t lead = 0);

/// tile IR -> LLVM dialect for the host: flashjit-lower-tile-to-loops, then
/// the host lowering (LICM, SCF -> CF, memref / math / arith / index / func
/// / cf -> LLVM, canonicalize).
void buildCpuLoweringPipeline(mlir::OpPassManager &pm);

/// attn -> LLVM dialect for the host: the CPU execution mode (the tiling
/// pipeline, then buildCpuLoweringPipeline).
void buildCpuPipeline(mlir::OpPassManager &pm, const TileConfig &config,
                      bool dqQuadOrder = usesDqQuadOrder(), int64_t lead = 0);

/// attn -> gpu.module in the LLVM + NVVM dialects (tensor-core kernel),
/// ready for translation to LLVM IR and PTX: the tiling pipeline, then
/// buildGpuLoweringPipeline. Stops after the lowering to the gpu dialect
/// when \p stopAtGpu (the `gpu` stage).
void buildGpuPipeline(mlir::OpPassManager &pm, const TileConfig &config,
                      const GpuLoweringConfig &gpu, bool stopAtGpu = false,
                      bool dqQuadOrder = usesDqQuadOrder(), int64_t lead = 0);

/// tile IR -> gpu.module in the LLVM + NVVM dialects: the GPU lowering
/// (flashjit-lower-tiled-to-gpu with \p warps warps), cleanup and, unless
/// \p stopAtGpu, the conversion to NVVM.
void buildGpuLoweringPipeline(mlir::OpPassManager &pm, int64_t warps,
                              const GpuLoweringConfig &gpu,
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
