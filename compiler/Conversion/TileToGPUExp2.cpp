//===- TileToGPUExp2.cpp - A share of the softmax's exp2 on the FMA pipe --===//
//
/// \file
/// A pattern of the elementwise op family (TileToGPUCompute.cpp): with
/// KernelPlacement::exp2Emulation = k (the `exp2-emulation` option, 1..8),
/// k eighths of the registers of the softmax's P = exp2(x) tile are
/// computed by arithmetic (kernels/Exp2Emulation.h) instead of by
/// ex2.approx on the multi-function unit, which a softcap forward also
/// needs for tanh.approx. Only the exponential of a score tile less a
/// broadcast row value (the row max in the forward, the lse in the
/// backward) is taken: its argument is at most about 0 (or NaN, or -inf),
/// the range the emulation is written for. Before (one register):
///
///   %x = math.fma %s, %scale, %neg_max_b : tensor<128x128xf32>
///   %p = math.exp2 %x : tensor<128x128xf32>
///     -> %p_i = ex2.approx.ftz.f32 %x_i
///
/// After, for the registers i with i % 8 < k:
///
///   %xc = arith.maximumf %x_i, -127.0          (max.NaN.f32)
///   %t = arith.addf %xc, 12582912.0
///   %f = arith.subf %xc, (arith.subf %t, 12582912.0)
///   %q = math.fma(math.fma(math.fma(c3, %f, c2), %f, c1), %f, 1.0)
///   %e = arith.addi (arith.shli (bitcast %t : i32), 23), 0x3f800000
///   %p_i = arith.mulf %q, (bitcast %e : f32)
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"
#include "kernels/Exp2Emulation.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;

/// Whether \p x is a 2-D tile less a broadcast row value: fma(s, c,
/// broadcast(r)) or subf(s, broadcast(r)) with r's tile.broadcast along
/// dim 1 (the softmax's exponent, which is at most about 0).
static bool isScoreLessRowValue(Value x) {
  auto rowBroadcast = [](Value v) {
    auto b = v.getDefiningOp<tile::BroadcastOp>();
    return b && b.getDim() == 1;
  };
  if (auto fma = x.getDefiningOp<math::FmaOp>())
    return rowBroadcast(fma.getC());
  if (auto sub = x.getDefiningOp<arith::SubFOp>())
    return rowBroadcast(sub.getRhs());
  return false;
}

/// 2^x by kernels/Exp2Emulation.h's steps on one f32 register.
static Value emulatedExp2(ImplicitLocOpBuilder &b, flashjit::gpu::GpuBuilder &g,
                          Value x) {
  using namespace flashjit::exp2emu;
  Value xc = arith::MaximumFOp::create(b, x, g.cf(kLow));
  Value t = g.fadd(xc, g.cf(kRound));
  Value f = g.fsub(xc, g.fsub(t, g.cf(kRound)));
  Value q =
      g.fma(g.fma(g.fma(g.cf(kC3), f, g.cf(kC2)), f, g.cf(kC1)), f, g.cf(1.0));
  Value tBits = arith::BitcastOp::create(b, g.i32, t);
  Value scaleBits =
      g.add(arith::ShLIOp::create(b, tBits, g.c32(23)), g.c32(0x3f800000));
  return g.fmul(q, arith::BitcastOp::create(b, g.f32, scaleBits));
}

std::optional<LogicalResult>
TileKernelLowering::lowerEmulatedExp2(Operation *op) {
  auto exp = dyn_cast<math::Exp2Op>(op);
  if (!exp || place.exp2Emulation <= 0 || tileType(exp).getRank() != 2 ||
      !isScoreLessRowValue(exp.getOperand()))
    return std::nullopt;
  auto it = frags.find(exp.getOperand());
  if (it == frags.end() || it->second.pendingRound)
    return std::nullopt; // lowerElementwise names the problem
  Fragment out;
  for (auto [i, x] : llvm::enumerate(it->second.regs))
    out.regs.push_back(int64_t(i % 8) < place.exp2Emulation
                           ? emulatedExp2(b, g, x)
                           : g.exp2(x));
  frags[exp.getResult()] = std::move(out);
  return success();
}
