//===- BiasProduct.h - An affine score bias as one more product -*- C++ -*-===//
//
/// \file
/// biasAsProduct: a score bias that is a uniform factor times an affine
/// function of the block's row and column (ALiBi's slope (c - r) after
/// peelUniformAddend) as one more k = 16 step of the Q K^T product, so
/// that no score pays an instruction for it. Internal to
/// dialects/Attn/Transforms.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_DIALECTS_ATTN_TRANSFORMS_BIASPRODUCT_H
#define FLASHJIT_DIALECTS_ATTN_TRANSFORMS_BIASPRODUCT_H

#include "mlir/IR/ImplicitLocOpBuilder.h"
#include "mlir/IR/Value.h"

#include <optional>

namespace flashjit::attn::detail {

/// When the f32 score tile \p s (Br x Bc) is fma(S, splat(\p scale), Y),
/// S = tile.dot(Q, K^T) of bf16 tiles without an accumulator, and Y =
/// U * sitofp(a c + b r + k) (or sitofp of it alone) for a uniform tile U
/// and integer constants a, b, k over the block's column c and row r: the
/// tile S' = S + A B with A (Br x 16) and B (16 x Bc) bf16 tiles built
/// before Y's use, A's columns the three bf16 parts of U a / scale and of
/// U (b r + k) / scale, B's rows c (three times) and 1 (three times), so
/// that S' * scale is \p s up to f32 rounding (c < Bc <= 256 is exact in
/// bf16; three parts keep 24 bits of each factor). S' is inserted right
/// after S, so that a target issues the two products as one chain. Else
/// nullopt and nothing changed. The caller takes S' as raw scores, with
/// scale in its exponent's factor.
std::optional<mlir::Value> biasAsProduct(mlir::ImplicitLocOpBuilder &b,
                                         mlir::Value s, mlir::Value scale);

} // namespace flashjit::attn::detail

#endif // FLASHJIT_DIALECTS_ATTN_TRANSFORMS_BIASPRODUCT_H
