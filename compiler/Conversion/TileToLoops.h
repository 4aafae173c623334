//===- TileToLoops.h - Shared by flashjit-lower-tile-to-loops ---*- C++ -*-===//
//
/// \file
/// The state of lowering one function's tile IR to loops on buffers: the
/// buffer of every tile value, the entry-block builder that hoists every
/// alloca, and the lowering routines, one per op family. TileToLoops.cpp
/// holds the driver and the control flow (scf.for, scf.if), TileToLoopsOps.cpp
/// the tile ops and the elementwise arith / math ops.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_CONVERSION_TILETOLOOPS_H
#define FLASHJIT_COMPILER_CONVERSION_TILETOLOOPS_H

#include "dialects/Tile/IR/TileDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"
#include "llvm/ADT/DenseMap.h"

namespace flashjit::conversion {

/// tile::quadColumn of \p col (an index or an integer of any width) in
/// arith ops of its type: where a row in `quad_order` keeps column col.
/// Both lowerings build it (the CPU's loops, the GPU's reductions and
/// row loads), so they agree on the layout.
mlir::Value buildQuadColumn(mlir::ImplicitLocOpBuilder &b, mlir::Value col);

} // namespace flashjit::conversion

namespace flashjit::conversion::tiles {

/// Whether \p type is a tile: a statically shaped tensor of rank 1 or 2.
bool isTileType(mlir::Type type);

/// Whether \p op is an elementwise arith / math op on tiles (the
/// ElementwiseMappable ops: cloned on scalars, element by element).
bool isElementwiseOnTiles(mlir::Operation *op);

/// Checks that every op of \p func that carries a tensor can be lowered;
/// emits a named error at the first one that cannot.
mlir::LogicalResult checkLowerable(mlir::func::FuncOp func);

/// Lowers the tile IR of one function in place (checkLowerable first).
class TileLowering {
public:
  explicit TileLowering(mlir::func::FuncOp func);

  /// Rewrites the body: no tensor and no tile op remains.
  mlir::LogicalResult run();

private:
  // Driver and control flow (TileToLoops.cpp).
  mlir::LogicalResult lowerBlock(mlir::Block &block);
  mlir::LogicalResult lowerOp(mlir::Operation *op);
  mlir::LogicalResult lowerFor(mlir::scf::ForOp op);
  mlir::LogicalResult lowerIf(mlir::scf::IfOp op);
  /// Copies the tiles a yield passes into \p dests (null for scalars), through
  /// temporaries where one copy's source is another's destination.
  void copyYielded(mlir::OpBuilder &b, mlir::Location loc,
                   mlir::ValueRange values, llvm::ArrayRef<mlir::Value> dests);

  // The op families (TileToLoopsOps.cpp).
  void lowerLoad(mlir::OpBuilder &b, tile::LoadOp op);
  void lowerStore(mlir::OpBuilder &b, mlir::Operation *op, mlir::Value value,
                  mlir::Value base, mlir::Value offset, mlir::Value row0,
                  mlir::Value rows, mlir::Value stride, mlir::Value group,
                  mlir::Value groupStride, bool atomic, bool quadOrder = false);
  void lowerDot(mlir::OpBuilder &b, tile::DotOp op);
  void lowerReduce(mlir::OpBuilder &b, tile::ReduceOp op);
  void lowerBroadcast(mlir::OpBuilder &b, tile::BroadcastOp op);
  void lowerIota(mlir::OpBuilder &b, tile::IotaOp op);
  void lowerGather(mlir::OpBuilder &b, tile::GatherOp op);
  void lowerScatterAdd(mlir::OpBuilder &b, tile::ScatterAddOp op);
  void lowerScatter(mlir::OpBuilder &b, tile::ScatterOp op);
  void lowerConstant(mlir::OpBuilder &b, mlir::arith::ConstantOp op);
  void lowerElementwise(mlir::OpBuilder &b, mlir::Operation *op);

public:
  // Buffers (TileToLoops.cpp).
  /// A fresh buffer for a tile of \p type, allocated in the entry block.
  mlir::Value newBuffer(mlir::Type tileType);
  /// A fresh buffer, recorded as the one of \p tile.
  mlir::Value defineBuffer(mlir::Value tile);
  /// The buffer of an already lowered tile (a splat's is filled on demand).
  mlir::Value buffer(mlir::Value tile);
  /// The buffer of \p operand if \p user may overwrite it in place (it is
  /// \p operand's only use, in the block of its definition, by an op that
  /// reads each element before writing it), else null. Keeps the entry
  /// block's stack frame small: a chain of elementwise ops shares a buffer.
  mlir::Value reusableBuffer(mlir::Value operand, mlir::Operation *user,
                             mlir::Type resultType);
  /// Element \p ivs of \p tile: the scalar of a splat, else a load.
  mlir::Value element(mlir::OpBuilder &b, mlir::Location loc, mlir::Value tile,
                      mlir::ValueRange ivs);
  /// dst = src, element by element.
  void copy(mlir::OpBuilder &b, mlir::Location loc, mlir::Value src,
            mlir::Value dst);

private:
  mlir::func::FuncOp func;
  /// Inserts at the start of the entry block: every alloca is hoisted there.
  mlir::OpBuilder allocBuilder;
  mlir::Operation *lastAlloca = nullptr;
  llvm::DenseMap<mlir::Value, mlir::Value> buffers;
  /// Splat tiles (tile.splat, arith.constant dense<c>): their scalar. Their
  /// buffer is filled only if an op needs one.
  llvm::DenseMap<mlir::Value, mlir::Value> splats;
  /// The ops replaced, erased once everything is lowered.
  llvm::SmallVector<mlir::Operation *> dead;
};

/// Builds a loop nest over \p shape (constant bounds, step 1) and calls
/// \p body with the induction variables, innermost last.
void forEachIndex(mlir::OpBuilder &b, mlir::Location loc,
                  llvm::ArrayRef<int64_t> shape,
                  llvm::function_ref<void(mlir::OpBuilder &, mlir::Location,
                                          mlir::ValueRange)>
                      body);

/// An index constant.
mlir::Value indexConst(mlir::OpBuilder &b, mlir::Location loc, int64_t v);

} // namespace flashjit::conversion::tiles

#endif // FLASHJIT_COMPILER_CONVERSION_TILETOLOOPS_H
