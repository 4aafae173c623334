//===- TileToGPUTanh.cpp - A score tile's tanh on the FMA pipe ------------===//
//
/// \file
/// A pattern of the elementwise op family (TileToGPUCompute.cpp): with
/// KernelPlacement::tanhPolynomial = k (the `tanh-polynomial` option,
/// 1..8), k eighths of the registers of a 2-D tile's tanh (softcap's C
/// tanh(s / C), in the forward and the backward: registers i with i % 8 <
/// k) are computed by kernels/TanhPolynomial.h's polynomial on the FMA
/// pipe when each of those registers of the warp lies in [-1, 1] (one
/// vote), and by tanh.approx.f32 on the multi-function unit otherwise;
/// the other registers stay on the unit. The branch is warp-uniform, so
/// no lane runs both sides. Before (one thread's registers x_0 .. x_n-1
/// of the share; k = 8: all):
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
  if (!tanh || place.tanhPolynomial <= 0 || tileType(tanh).getRank() != 2)
    return std::nullopt;
  auto it = frags.find(tanh.getOperand());
  if (it == frags.end() || it->second.pendingRound ||
      it->second.regs.empty())
    return std::nullopt; // lowerElementwise names the problem
  const SmallVector<Value> regs = it->second.regs;
  // The share: registers i with i % 8 < tanhPolynomial; the others stay on
  // the unit, outside the branch.
  SmallVector<Value> out(regs.size());
  SmallVector<size_t> shared;
  for (size_t i = 0; i < regs.size(); ++i) {
    if (int64_t(i % 8) < place.tanhPolynomial)
      shared.push_back(i);
    else
      out[i] = lowerScalarMath(b, g, op, regs[i]);
  }
  SmallVector<Value> args;
  for (size_t i : shared)
    args.push_back(regs[i]);
  Value inRange = arith::CmpFOp::create(b, arith::CmpFPredicate::OLE,
                                        largestMagnitude(b, g, args),
                                        g.cf(tanhpoly::kBound));
  Value all =
      g.intrinsic("llvm.nvvm.vote.all.sync", {g.i1}, {g.c32(-1), inRange});
  SmallVector<Type> types(args.size(), g.f32);
  auto ifOp = scf::IfOp::create(b, types, all, /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifOp.thenBlock());
    SmallVector<Value> poly;
    for (Value x : args)
      poly.push_back(polynomialTanh(g, x));
    scf::YieldOp::create(b, poly);
    b.setInsertionPointToStart(ifOp.elseBlock());
    SmallVector<Value> unit;
    for (Value x : args)
      unit.push_back(lowerScalarMath(b, g, op, x));
    scf::YieldOp::create(b, unit);
  }
  for (auto [k, i] : llvm::enumerate(shared))
    out[i] = ifOp.getResult(k);
  frags[tanh.getResult()].regs.assign(out.begin(), out.end());
  return success();
}
