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

#endif // FLASHJIT_DIALECTS_TILE_IR_TILEDIALECT_H
