//===- TileToGPUConstants.cpp - Constant operand tiles in shared memory ---===//
//
/// \file
/// A product's rhs that is a constant expression (iotas, splat constants
/// and elementwise ops of them, rounded by arith.truncf: the bias product's
/// B of dialects/Attn/Transforms/BiasProduct.cpp) has no registers: it
/// lives in a shared slot of its own after every other (assignHomes), which
/// the block's threads fill once at the kernel's start, each element
/// computed where it is stored. Before:
///
///   %k = tile.iota dim 0 : tensor<16x128xi32>
///   %c = arith.sitofp (tile.iota dim 1 : tensor<16x128xi32>)
///   %v = arith.select (%k < 3), %c, ...
///   %B = arith.truncf %v : tensor<16x128xf32> to tensor<16x128xbf16>
///   %s = tile.dot %A, %B acc %S
///
/// After, before the roles split (the ring's first barrier orders it):
///
///   for e in tid, tid + threads, ... < 16 * 128:
///     r = e / 128, c = e % 128
///     st.shared.b16 [B's slot + blocked(r, c)], bf16(select(r < 3, c, ...))
///   fence.proxy.async (wgmma reads the slot)
///
/// and the product reads the slot as it reads a loaded tile (MN-major).
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Matchers.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;

/// Appends the ops that compute \p v to \p slice in post-order when \p v is
/// a constant expression (see the file comment); false otherwise.
static bool constantSlice(Value v, llvm::SetVector<Operation *> &slice,
                          int depth = 0) {
  Operation *op = v.getDefiningOp();
  if (!op || depth > 32)
    return false;
  if (slice.contains(op))
    return true;
  DenseElementsAttr dense;
  if (isa<tile::IotaOp>(op) ||
      (matchPattern(v, m_Constant(&dense)) && dense.isSplat())) {
    slice.insert(op);
    return true;
  }
  if (!isa<arith::ArithDialect, math::MathDialect>(op->getDialect()) ||
      !op->hasTrait<OpTrait::Elementwise>() || op->getNumRegions() ||
      op->getNumResults() != 1 || !isMemoryEffectFree(op))
    return false;
  for (Value operand : op->getOperands())
    if (!constantSlice(operand, slice, depth + 1))
      return false;
  slice.insert(op);
  return true;
}

void TileKernelLowering::findSharedConstants() {
  if (!place.wgmma) // (the slot is written in the blocked layout)
    return;
  fn.walk([&](tile::DotOp dot) {
    Value rhs = dot.getRhs();
    auto round = rhs.getDefiningOp<arith::TruncFOp>();
    if (!round || sharedConstants.count(rhs) || tileType(rhs).getRank() != 2 ||
        tileType(rhs).getElementType() != g.halfTy)
      return;
    llvm::SetVector<Operation *> slice;
    if (!constantSlice(rhs, slice))
      return;
    // Only if nothing else reads the slice: its ops get no registers.
    for (Operation *op : slice)
      for (Operation *user : op->getUsers())
        if (!slice.contains(user) &&
            !(op == round && isa<tile::DotOp>(user) &&
              cast<tile::DotOp>(user).getRhs() == rhs))
          return;
    constantOps.insert(slice.begin(), slice.end());
    sharedConstants[rhs] = SharedSlot();
  });
}

void TileKernelLowering::fillSharedConstants() {
  if (sharedConstants.empty())
    return;
  const int64_t threads = place.threads + place.producerThreads;
  for (auto &[v, slot] : sharedConstants) {
    RankedTensorType ty = tileType(v);
    const int64_t rows = ty.getDimSize(0), cols = ty.getDimSize(1);
    llvm::SetVector<Operation *> slice;
    (void)constantSlice(v.getDefiningOp()->getOperand(0), slice);
    for (int64_t first = 0; first < rows * cols; first += threads) {
      Value e = g.add(tid, g.c32(first));
      auto store = [&] {
        Value r = g.divU(e, g.c32(cols)), c = g.remU(e, g.c32(cols));
        // The slice on scalars: iotas become r and c, splats their value.
        IRMapping scalars;
        for (Operation *op : slice) {
          DenseElementsAttr dense;
          if (auto iota = dyn_cast<tile::IotaOp>(op)) {
            scalars.map(iota.getResult(), iota.getDim() == 0 ? r : c);
          } else if (matchPattern(op->getResult(0), m_Constant(&dense))) {
            scalars.map(op->getResult(0),
                        arith::ConstantOp::create(
                            b, cast<TypedAttr>(dense.getSplatValue<Attribute>())));
          } else {
            Operation *scalar = b.clone(*op, scalars);
            Value res = scalar->getResult(0);
            res.setType(getElementTypeOrSelf(res.getType()));
          }
        }
        Value value = scalars.lookup(v.getDefiningOp()->getOperand(0));
        Value at = g.add(g.c32(slot.offset), g.swizzledBlocked(r, c, rows * 128));
        at = g.add(at, g.mul(g.remU(c, g.c32(8)), g.c32(2)));
        LLVM::StoreOp::create(b, g.toElementBits(value),
                              g.sharedBytePtr(smem, at));
      };
      if (first + threads <= rows * cols)
        store();
      else
        g.ifThen(g.cmp(arith::CmpIPredicate::ult, e, g.c32(rows * cols)),
                 store);
    }
  }
  if (wg)
    wg->fenceProxyAsync(); // generic-proxy writes, read by wgmma
  if (!place.ringStages) // (the ring's first barrier follows)
    g.barrier();
}
