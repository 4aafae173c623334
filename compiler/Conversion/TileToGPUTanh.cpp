//===- TileToGPUTanh.cpp - A score tile's tanh on the FMA pipe ------------===//
//
/// \file
/// A pattern of the elementwise op family (TileToGPUCompute.cpp): with
/// KernelPlacement::tanhPolynomial (the `tanh-polynomial` option), the
/// tanh of a 2-D tile (softcap's C tanh(s / C), in the forward and the
/// backward) is computed by kernels/TanhPolynomial.h's polynomial on the
/// FMA pipe when every register of the warp's share of the tile lies in
/// [-1, 1] (one vote), and by tanh.approx.f32 on the multi-function unit
/// otherwise; that unit then serves only the softmax's exponential. The
/// branch is warp-uniform, so no lane runs both sides. Before (one
/// thread's registers x_0 .. x_n-1):
///
///   %t = math.tanh %x : tensor<128x128xf32>
///     -> %t_i = tanh.approx.f32 %x_i
///
/// After:
///
///   %m = max(|x_0|, ..., |x_n-1|)          (abs.f32, max.f32: a tree)
///   %in = vote.sync.all.pred (%m <= 1.0)
///   %t_0 .. %t_n-1 = scf.if %in {
///     %y = %x_i * %x_i
///     %q = (fma(fma(c3, %y, c2), %y, c1)) * %y
///     yield fma(%x_i, %q, %x_i) ...
///   } else {
///     yield tanh.approx.f32 %x_i ...
///   }
///
/// A NaN register leaves max to the others' (maxnum), and the polynomial
/// keeps it NaN; an infinite one takes the unit's side.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"
#include "kernels/TanhPolynomial.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;

/// kernels/TanhPolynomial.h's steps on one f32 register.
static Value polynomialTanh(flashjit::gpu::GpuBuilder &g, Value x) {
  using namespace flashjit::tanhpoly;
  Value y = g.fmul(x, x);
  Value q = g.fmul(g.fma(g.fma(g.cf(kC3), y, g.cf(kC2)), y, g.cf(kC1)), y);
  return g.fma(x, q, x);
}

/// The largest |x| of \p regs, by a balanced tree of max.f32.
static Value largestMagnitude(ImplicitLocOpBuilder &b,
                              flashjit::gpu::GpuBuilder &g, ValueRange regs) {
  SmallVector<Value> level;
  for (Value x : regs)
    level.push_back(ptxUnaryF32(b, g.f32, x, "abs.f32 $0, $1;"));
  while (level.size() > 1) {
    SmallVector<Value> next;
    for (size_t i = 0; i + 1 < level.size(); i += 2)
      next.push_back(g.fmax(level[i], level[i + 1]));
    if (level.size() % 2)
      next.push_back(level.back());
    level = std::move(next);
  }
  return level.front();
}

std::optional<LogicalResult>
TileKernelLowering::lowerPolynomialTanh(Operation *op) {
  auto tanh = dyn_cast<math::TanhOp>(op);
  if (!tanh || !place.tanhPolynomial || tileType(tanh).getRank() != 2)
    return std::nullopt;
  auto it = frags.find(tanh.getOperand());
  if (it == frags.end() || it->second.pendingRound ||
      it->second.regs.empty())
    return std::nullopt; // lowerElementwise names the problem
  const SmallVector<Value> regs = it->second.regs;
  Value inRange =
      arith::CmpFOp::create(b, arith::CmpFPredicate::OLE,
                            largestMagnitude(b, g, regs),
                            g.cf(tanhpoly::kBound));
  Value all =
      g.intrinsic("llvm.nvvm.vote.all.sync", {g.i1}, {g.c32(-1), inRange});
  SmallVector<Type> types(regs.size(), g.f32);
  auto ifOp = scf::IfOp::create(b, types, all, /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifOp.thenBlock());
    SmallVector<Value> poly;
    for (Value x : regs)
      poly.push_back(polynomialTanh(g, x));
    scf::YieldOp::create(b, poly);
    b.setInsertionPointToStart(ifOp.elseBlock());
    SmallVector<Value> unit;
    for (Value x : regs)
      unit.push_back(lowerScalarMath(b, g, op, x));
    scf::YieldOp::create(b, unit);
  }
  frags[tanh.getResult()].regs.assign(ifOp.getResults().begin(),
                                      ifOp.getResults().end());
  return success();
}
