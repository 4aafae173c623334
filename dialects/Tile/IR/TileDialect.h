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

} // namespace flashjit::tile

#endif // FLASHJIT_DIALECTS_TILE_IR_TILEDIALECT_H
