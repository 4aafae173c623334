//===- KernelEmitters.h - The op families of the GPU lowering ---*- C++ -*-===//
//
/// \file
/// flashjit-lower-tiled-to-gpu (LowerTiledToGPU.cpp) walks the tiled
/// functions (carrying `attn.kernel`) and hands each to the tile IR's GPU
/// lowering (TileToGPU.h), which adds one gpu.func of the same name to the
/// gpu.module. Internal.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_CONVERSION_KERNELEMITTERS_H
#define FLASHJIT_COMPILER_CONVERSION_KERNELEMITTERS_H

#include "compiler/Conversion/GpuBuilder.h"
#include "compiler/Conversion/GpuLoweringConfig.h"
#include "dialects/Attn/IR/AttnDialect.h"
#include "kernels/AttentionSpec.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace flashjit::conversion {

/// The most dynamic shared memory any target gives one block (sm_90: 227
/// KB); a device with less is checked again by the launcher.
constexpr int64_t kMaxSharedBytes = 232448;

/// Lowers a tiled forward function, written in the tile dialect, into a
/// gpu.func of \p warps warps (TileToGPU.h; emits its errors on \p fn or the
/// op at fault), placed by \p knobs (GpuLoweringKnobs.def): its products on
/// warpgroup MMAs where `wgmma` and the shape allow, and then its K/V blocks
/// through a ring of `kvRingStages` stages filled by a producer warpgroup
/// (GpuGeometry::ringStages; 0 or 1: no ring), its consumer warpgroups
/// taking turns at the tensor cores by `pingPong` (KernelPlacement::pingPong);
/// with the ring and `persistent`, as a persistent kernel
/// (KernelPlacement::persistent); with the ring and `tma`, K and V (1), and
/// Q too (2), by the tensor memory accelerator where their addresses allow
/// (KernelPlacement::tma); its output through a dead shared slot where
/// `stagedStores` (KernelPlacement::stagedStores); `exp2Emulation` eighths of
/// the softmax's exponentials by arithmetic (KernelPlacement::exp2Emulation);
/// `tanhPolynomial` eighths of a score tile's tanh by a polynomial
/// (KernelPlacement::tanhPolynomial, the backward's too).
mlir::LogicalResult lowerTileKernel(mlir::func::FuncOp fn,
                                    mlir::gpu::GPUModuleOp gpuModule,
                                    int64_t warps,
                                    const GpuLoweringConfig &knobs);

/// Lowers one of the backward's tiled functions, written in the tile
/// dialect, into a gpu.func of \p warps warps by its role
/// (TileToGPUPlacement.cpp): its copies, atomics (`vectorAtomics`), warpgroup
/// MMAs (`wgmma`), bulk dQ (`bulkDq`) and Q/dO ring (`bwdRingStages`) as
/// \p knobs say.
mlir::LogicalResult lowerTileBackwardKernel(mlir::func::FuncOp fn,
                                            mlir::gpu::GPUModuleOp gpuModule,
                                            int64_t warps,
                                            const GpuLoweringConfig &knobs);

/// The AttentionSpec of a description's fields (an attn op's or an
/// #attn.kernel's, both verified): the one mapping of mask names and
/// element types; a dense spec keeps AttentionSpec's default sparse block.
AttentionSpec describedSpec(Direction direction, int64_t headDimQk,
                            int64_t headDimV, mlir::Type elementType,
                            llvm::StringRef mask, int64_t gqa,
                            int64_t sparseBlock, bool deterministic);

/// The description a tiling pass recorded on a tiled function
/// (`attn.kernel`, verified): head dims, element type, mask, GQA group,
/// sparse block, direction (from the role) and `deterministic`.
AttentionSpec specFromAttr(attn::KernelAttr attr);

/// Checks the GPU lowering's options against the function's tiling before
/// any code is made (a named error on \p fn): warps in [1, 16], copy-bytes
/// 2, 4, 8 or 16, tiles that fit the warps, the shared memory (227 KB, the
/// most any target gives a block) and the registers; the stages as
/// gpuConfigProblem takes them with \p kvRing.
mlir::LogicalResult checkGpuOptions(mlir::func::FuncOp fn,
                                    const AttentionSpec &spec,
                                    const TileConfig &config, int64_t copyBytes,
                                    bool kvRing);

/// Appends a `gpu.func` kernel named as \p tiled, taking \p argTys, with a
/// known block size of \p threads, the dynamic shared memory it needs
/// recorded as `attn.shared_bytes` and its grid as `attn.grid` (\p grid,
/// kernels/KernelLaunch.h); copies the description attributes.
mlir::gpu::GPUFuncOp createKernelFunc(mlir::ImplicitLocOpBuilder &b,
                                      mlir::gpu::GPUModuleOp gpuModule,
                                      mlir::func::FuncOp tiled,
                                      mlir::TypeRange argTys, int64_t threads,
                                      int64_t sharedBytes,
                                      mlir::DictionaryAttr grid);

/// The `attn.grid` record: pid_m over \p rows rows of the keys
/// (\p overKeys) or the queries, pid_bh over the KV heads (\p kvHeads) or
/// all heads, \p programsZ programs along grid.z (or, \p kvSplit, the
/// launch's split count: a unit `split`); \p persistent: grid.x is the
/// launch's program count and grid.y 1 (a unit `persistent`), and
/// \p scheduled: it takes a tile schedule (a unit `scheduled`).
mlir::DictionaryAttr gridAttr(mlir::Builder &b, int64_t rows, bool overKeys,
                              bool kvHeads, int64_t programsZ,
                              bool kvSplit = false, bool persistent = false,
                              bool scheduled = false);

/// The base of the dynamic shared memory (`@flashjit_smem`).
mlir::Value sharedMemoryBase(mlir::ImplicitLocOpBuilder &b, gpu::GpuBuilder &g);

} // namespace flashjit::conversion

#endif // FLASHJIT_COMPILER_CONVERSION_KERNELEMITTERS_H
