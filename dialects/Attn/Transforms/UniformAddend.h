//===- UniformAddend.h - A score tile's uniform addend, peeled --*- C++ -*-===//
//
/// \file
/// peelUniformAddend: a modified score tile whose bias is an invariant tile
/// plus one value that changes per block of keys (ALiBi's slope (j - i) is
/// slope (c - r) + slope (n0 - m0) for element (r, c) of the block at
/// (m0, n0)) as the invariant form and that value: the softmax adds the
/// value once per row, and the invariant tile leaves the KV loop. Internal
/// to dialects/Attn/Transforms.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_DIALECTS_ATTN_TRANSFORMS_UNIFORMADDEND_H
#define FLASHJIT_DIALECTS_ATTN_TRANSFORMS_UNIFORMADDEND_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/Value.h"

#include <optional>
#include <utility>

namespace flashjit::attn::detail {

/// When the f32 score tile \p s (Br x Bc) is fma(A, B, X) or A + X (either
/// order) and X is, by its additive structure (adds, subtractions, sitofp
/// / index_cast / extsi, products with uniform tiles), Y + bcast(u) with Y
/// free of the innermost loop around \p b's insertion point: (fma(A, B, Y)
/// or A + Y, u), with Y's ops moved before that loop (or, outside any
/// loop, where they are). u is a Br tile of one f32 value (its ops those
/// of X's uniform parts, on the row shape), built at the insertion point
/// but for its loop-invariant parts. Else nullopt and nothing changed.
/// Y + u is X up to rounding: sitofp of a sum is taken as the sum of the
/// two sitofps (exact while the indices stay below 2^24) and a uniform
/// factor is distributed over the sum.
std::optional<std::pair<mlir::Value, mlir::Value>>
peelUniformAddend(mlir::OpBuilder &b, mlir::Location loc, mlir::Value s);

/// The value of a splat integer tile (a splat constant, or tile.splat of a
/// scalar constant), else nullopt.
std::optional<int64_t> splatIntValue(mlir::Value v);
/// The value of a splat float tile, the same way, else nullopt.
std::optional<double> splatFloatValue(mlir::Value v);

/// Whether tile \p v has one value in every element: a splat, a splat
/// constant, or a pure arith / math op of such tiles.
bool isUniformTile(mlir::Value v);

/// Uniform tile \p v (isUniformTile) rebuilt on the row shape (\p rows,
/// its element type) by the same ops, at \p b's insertion point.
mlir::Value uniformRow(mlir::OpBuilder &b, mlir::Location loc, mlir::Value v,
                       int64_t rows);

} // namespace flashjit::attn::detail

#endif // FLASHJIT_DIALECTS_ATTN_TRANSFORMS_UNIFORMADDEND_H
