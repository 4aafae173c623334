//===- TileDialect.h - The tile dialect -------------------------*- C++ -*-===//
//
/// \file
/// Declares the tile dialect and its ops (generated from TileOps.td): the
/// stage that the CPU execution mode and the GPU lowering both compile.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_DIALECTS_TILE_IR_TILEDIALECT_H
#define FLASHJIT_DIALECTS_TILE_IR_TILEDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialects/Tile/IR/TileDialect.h.inc"

#define GET_OP_CLASSES
#include "dialects/Tile/IR/TileOps.h.inc"

namespace flashjit::tile {

/// The check both lowerings of a kernel start with: a function that carries
/// `attn.kernel` must write something (a tile.store, tile.atomic_add or a
/// memref store); an emptied body is a named error on \p kernel, not a
/// kernel that leaves its outputs unwritten.
mlir::LogicalResult verifyWritesOutput(mlir::Operation *kernel);

/// Where `quad_order` (tile.atomic_add, tile.load) keeps column \p c of a
/// row: inside its group of 16, columns 2i, 2i+1, 2i+8, 2i+9 at 4i .. 4i+3.
constexpr int64_t quadColumn(int64_t c) {
  return (c & ~int64_t(15)) | ((c & 7) >> 1) << 2 | ((c >> 3) & 1) << 1 |
         (c & 1);
}
static_assert(quadColumn(2) == 4 && quadColumn(8) == 2 &&
              quadColumn(15) == 15 && quadColumn(25) == 19);

} // namespace flashjit::tile

#endif // FLASHJIT_DIALECTS_TILE_IR_TILEDIALECT_H
