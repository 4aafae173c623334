//===- TileToGPUHalf.cpp - f16 register tiles, two elements at a time ----===//
//
/// \file
/// A pattern of the elementwise and rounding op families
/// (TileToGPUCompute.cpp) for f16 register tiles that are not the kernel's
/// element type: the values a tile IR computes in half precision on
/// purpose (the half-precision softmax, TileAttentionSoftmax.cpp), as
/// opposed to the rounding of an f32 tile to the element type for an MMA
/// or a store (Fragment::pendingRound). Such a tile's registers hold f16
/// scalars; registers 2i and 2i + 1 are adjacent columns of one row (the
/// accumulator order, TileFragments.h), so the math takes them in pairs,
/// one f16x2 instruction for both. Before (bf16 kernel):
///
///   %h = arith.truncf %x : tensor<128x128xf32> to tensor<128x128xf16>
///   %t = math.tanh %h : tensor<128x128xf16>
///   %e = math.fma %t, %f, %nf : tensor<128x128xf16>
///   %p = math.exp2 %e : tensor<128x128xf16>
///   %w = arith.extf %p : tensor<128x128xf16> to tensor<128x128xf32>
///
/// After, per register pair (x0, x1):
///
///   %v = cvt.rn.f16x2.f32 x1, x0          (the truncations, paired by LLVM)
///   %t = tanh.approx.f16x2 %v
///   %e = fma.rn.f16x2 %t, {f, f}, {nf, nf}
///   %p = ex2.approx.f16x2 %e
///   w0, w1 = cvt.f32.f16 of each half
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;

/// The pair (x0, x1) of f16 scalars as one vector<2xf16>.
static Value pairOf(ImplicitLocOpBuilder &b, flashjit::gpu::GpuBuilder &g, Value x0,
                    Value x1) {
  auto v2 = VectorType::get({2}, x0.getType());
  Value p = LLVM::PoisonOp::create(b, v2);
  p = LLVM::InsertElementOp::create(b, p, x0, g.c32(0));
  return LLVM::InsertElementOp::create(b, p, x1, g.c32(1));
}

Value conversion::halfPairsMax(ImplicitLocOpBuilder &b, flashjit::gpu::GpuBuilder &g,
                               ArrayRef<Value> halves) {
  Value acc = pairOf(b, g, halves[0], halves[1]);
  for (size_t i = 2; i + 1 < halves.size(); i += 2)
    acc = LLVM::MaxNumOp::create(b, acc, pairOf(b, g, halves[i], halves[i + 1]));
  Value lo = LLVM::ExtractElementOp::create(b, acc, g.c32(0));
  Value hi = LLVM::ExtractElementOp::create(b, acc, g.c32(1));
  return arith::ExtFOp::create(b, g.f32,
                               LLVM::MaxNumOp::create(b, lo, hi).getResult());
}

/// The f16x2 PTX instruction of a one-operand math op, or "".
static StringRef pairedApprox(Operation *op) {
  if (isa<math::TanhOp>(op))
    return "tanh.approx.f16x2 $0, $1;";
  if (isa<math::Exp2Op>(op))
    return "ex2.approx.f16x2 $0, $1;";
  return "";
}

std::optional<LogicalResult> TileKernelLowering::lowerHalfTile(Operation *op) {
  auto isHalfTile = [&](Value v) {
    return isTile(v) && tileType(v).getElementType().isF16() &&
           tileType(v).getElementType() != g.halfTy;
  };
  Type f16 = Float16Type::get(b.getContext());
  // The rounding into and out of half precision: per register (LLVM pairs
  // the truncations that feed an f16x2 instruction into one cvt).
  if (isa<arith::TruncFOp>(op) && isHalfTile(op->getResult(0))) {
    const Fragment &in = frags[op->getOperand(0)];
    if (in.pendingRound || tileType(op->getOperand(0)).getElementType() != g.f32)
      return fail(op, "rounds only f32 register tiles to f16");
    Fragment out;
    for (Value r : in.regs)
      out.regs.push_back(arith::TruncFOp::create(b, f16, r));
    frags[op->getResult(0)] = std::move(out);
    return success();
  }
  if (isa<arith::ExtFOp>(op) && isHalfTile(op->getOperand(0))) {
    if (tileType(op->getResult(0)).getElementType() != g.f32)
      return fail(op, "widens f16 register tiles only to f32");
    Fragment out;
    for (Value r : frags[op->getOperand(0)].regs)
      out.regs.push_back(arith::ExtFOp::create(b, g.f32, r));
    frags[op->getResult(0)] = std::move(out);
    return success();
  }
  if (op->getNumResults() != 1 || !isHalfTile(op->getResult(0)) ||
      !op->hasTrait<OpTrait::Elementwise>())
    return std::nullopt;
  const bool paired =
      isa<math::TanhOp, math::Exp2Op, math::FmaOp, arith::MulFOp,
          arith::AddFOp, arith::SubFOp>(op);
  if (!paired && isa<math::MathDialect>(op->getDialect()))
    return fail(op, "math on f16 tiles: only tanh, exp2 and fma are "
                    "lowered on the GPU");
  size_t count = 0;
  for (Value v : op->getOperands()) {
    if (!isTile(v) || !frags.count(v) || frags[v].pendingRound)
      return fail(op, "an f16 tile's operands are register tiles");
    count = frags[v].regs.size();
  }
  if (!paired || count % 2)
    return std::nullopt; // the scalar clone (selects, compares, odd counts)
  auto v2 = VectorType::get({2}, f16);
  Fragment out;
  for (size_t i = 0; i < count; i += 2) {
    SmallVector<Value> pairs;
    for (Value v : op->getOperands())
      pairs.push_back(pairOf(b, g, frags[v].regs[i], frags[v].regs[i + 1]));
    Value r;
    if (StringRef text = pairedApprox(op); !text.empty()) {
      Value bits = LLVM::BitcastOp::create(b, g.i32, pairs[0]);
      bits = LLVM::InlineAsmOp::create(
                 b, g.i32, ValueRange{bits}, text, "=r,r",
                 /*has_side_effects=*/false, /*is_align_stack=*/false,
                 LLVM::tailcallkind::TailCallKind::None, LLVM::AsmDialectAttr(),
                 ArrayAttr())
                 .getResult(0);
      r = LLVM::BitcastOp::create(b, v2, bits);
    } else if (isa<math::FmaOp>(op)) { // LLVM's, not libdevice's
      r = LLVM::FMAOp::create(b, pairs[0], pairs[1], pairs[2]);
    } else if (isa<arith::MulFOp>(op)) {
      r = LLVM::FMulOp::create(b, pairs[0], pairs[1]);
    } else if (isa<arith::AddFOp>(op)) {
      r = LLVM::FAddOp::create(b, pairs[0], pairs[1]);
    } else {
      r = LLVM::FSubOp::create(b, pairs[0], pairs[1]);
    }
    out.regs.push_back(LLVM::ExtractElementOp::create(b, r, g.c32(0)));
    out.regs.push_back(LLVM::ExtractElementOp::create(b, r, g.c32(1)));
  }
  frags[op->getResult(0)] = std::move(out);
  return success();
}
