//===- FoldConstantFactors.h - Constant factors, folded ---------*- C++ -*-===//
//
/// \file
/// foldConstantFactors: the products and quotients by constants that a
/// score modifier and its chain-rule derivative leave on the backward's
/// score tiles, combined (FoldConstantFactors.cpp shows softcap's). Internal
/// to dialects/Attn/Transforms.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_DIALECTS_ATTN_TRANSFORMS_FOLDCONSTANTFACTORS_H
#define FLASHJIT_DIALECTS_ATTN_TRANSFORMS_FOLDCONSTANTFACTORS_H

#include "mlir/IR/Operation.h"
#include "mlir/Support/LogicalResult.h"

namespace flashjit::attn::detail {

/// Rewrites the f32 tiles under \p root (a tiled function): x / c as
/// x * (1 / c); (x * a) * b as x * (a b), or, a being a splat of a scalar
/// %s, x * splat(%s * b); x * 1 as x; fma(x * a, b, z) as fma(x, a b, z);
/// c - x * y as fma(-x, y, c); a, b, c splat constants (tile constants or
/// tile.splat of scalar ones) of magnitude in [2^-60, 2^60], each inner
/// product read once. Only tiles: scalar index and bound arithmetic stays.
mlir::LogicalResult foldConstantFactors(mlir::Operation *root);

} // namespace flashjit::attn::detail

#endif // FLASHJIT_DIALECTS_ATTN_TRANSFORMS_FOLDCONSTANTFACTORS_H
