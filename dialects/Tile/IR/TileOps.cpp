//===- TileOps.cpp - The tile dialect's ops and verifiers -----------------===//
//
/// \file
/// Verifiers of the tile ops: every diagnostic names the operand or
/// attribute and the shapes or values it got, so that a malformed edit of
/// the shared stage is a named error before any lowering sees it.
//
//===----------------------------------------------------------------------===//

#include "dialects/Tile/IR/TileDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace flashjit::tile;

#include "dialects/Tile/IR/TileDialect.cpp.inc"

void TileDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/Tile/IR/TileOps.cpp.inc"
      >();
}

/// The checks that load, store and atomic_add share: the tile's element
/// type is the buffer's, a 2-D tile has a row stride and a 1-D one none.
static LogicalResult verifyGlobalAccess(Operation *op, RankedTensorType tile,
                                        MemRefType buffer, bool hasStride) {
  if (tile.getElementType() != buffer.getElementType())
    return op->emitOpError()
           << "tile element type " << tile.getElementType()
           << " must be the buffer's (" << buffer.getElementType() << ")";
  if (tile.getRank() == 2 && !hasStride)
    return op->emitOpError() << "a 2-D tile needs a row stride";
  if (tile.getRank() == 1 && hasStride)
    return op->emitOpError() << "a 1-D tile takes no stride";
  for (int64_t d : tile.getShape())
    if (d < 1)
      return op->emitOpError() << "tile dims must be >= 1, got " << tile;
  return success();
}

/// `group %G stride %gs` comes whole (the format parses it so; a builder
/// may not).
static LogicalResult verifyGroup(Operation *op, Value group, Value stride) {
  if (bool(group) != bool(stride))
    return op->emitOpError() << "a row group needs both its size and stride";
  return success();
}

/// `quad_order` permutes whole 16-column groups of 2-D rows.
static LogicalResult verifyQuadOrder(Operation *op, RankedTensorType tile,
                                     bool quadOrder) {
  if (quadOrder && (tile.getRank() != 2 || tile.getDimSize(1) % 16 != 0))
    return op->emitOpError()
           << "quad_order takes a 2-D tile of whole 16-column groups, got "
           << tile;
  return success();
}

LogicalResult LoadOp::verify() {
  if (failed(verifyGroup(*this, getGroup(), getGroupStride())) ||
      failed(verifyQuadOrder(*this, getType(), getQuadOrder())))
    return failure();
  return verifyGlobalAccess(*this, getType(), getBase().getType(),
                            bool(getStride()));
}

LogicalResult StoreOp::verify() {
  if (failed(verifyGroup(*this, getGroup(), getGroupStride())))
    return failure();
  return verifyGlobalAccess(*this, getValue().getType(), getBase().getType(),
                            bool(getStride()));
}

LogicalResult AtomicAddOp::verify() {
  if (!getValue().getType().getElementType().isF32())
    return emitOpError() << "adds f32 tiles, got " << getValue().getType();
  if (failed(verifyQuadOrder(*this, getValue().getType(), getQuadOrder())))
    return failure();
  return verifyGlobalAccess(*this, getValue().getType(), getBase().getType(),
                            bool(getStride()));
}

LogicalResult DotOp::verify() {
  auto lhs = getLhs().getType(), rhs = getRhs().getType();
  auto res = getResult().getType();
  Type et = lhs.getElementType();
  if (et != rhs.getElementType())
    return emitOpError() << "operands must share an element type, got "
                         << lhs.getElementType() << " and "
                         << rhs.getElementType();
  if (!et.isBF16() && !et.isF16() && !et.isF32())
    return emitOpError() << "operands must be bf16, f16 or f32, got " << et;
  if (!res.getElementType().isF32())
    return emitOpError() << "result must be f32, got " << res;
  int64_t m = lhs.getDimSize(getTransposeLhs() ? 1 : 0);
  int64_t k = lhs.getDimSize(getTransposeLhs() ? 0 : 1);
  int64_t k2 = rhs.getDimSize(getTransposeRhs() ? 1 : 0);
  int64_t n = rhs.getDimSize(getTransposeRhs() ? 0 : 1);
  if (k != k2)
    return emitOpError() << "contraction dims differ: " << k << " (lhs) and "
                         << k2 << " (rhs)";
  if (res.getDimSize(0) != m || res.getDimSize(1) != n)
    return emitOpError() << "result must be " << m << "x" << n << ", got "
                         << res;
  if (getAcc() && getAcc().getType() != res)
    return emitOpError() << "acc must have the result's type " << res
                         << ", got " << getAcc().getType();
  return success();
}

LogicalResult ReduceOp::verify() {
  if (getKind() != "max" && getKind() != "sum")
    return emitOpError() << "kind must be \"max\" or \"sum\", got \""
                         << getKind() << "\"";
  int64_t dim = getDim();
  if (dim != 0 && dim != 1)
    return emitOpError() << "dim must be 0 or 1, got " << dim;
  auto in = getValue().getType(), out = getResult().getType();
  if (!in.getElementType().isF32() ||
      out.getElementType() != in.getElementType())
    return emitOpError() << "reduces f32 tiles to f32, got " << in << " -> "
                         << out;
  if (out.getRank() != 1 || out.getDimSize(0) != in.getDimSize(1 - dim))
    return emitOpError() << "result must be tensor<" << in.getDimSize(1 - dim)
                         << "xf32>, got " << out;
  return success();
}

LogicalResult BroadcastOp::verify() {
  int64_t dim = getDim();
  if (dim != 0 && dim != 1)
    return emitOpError() << "dim must be 0 or 1, got " << dim;
  auto in = getValue().getType(), out = getResult().getType();
  if (in.getRank() != 1 || in.getElementType() != out.getElementType() ||
      out.getDimSize(1 - dim) != in.getDimSize(0))
    return emitOpError() << "cannot broadcast " << in << " to " << out
                         << " along dim " << dim;
  return success();
}

LogicalResult SplatOp::verify() {
  if (getValue().getType() != getType().getElementType())
    return emitOpError() << "splats " << getValue().getType()
                         << ", not the result's element type " << getType();
  return success();
}

LogicalResult IotaOp::verify() {
  int64_t dim = getDim();
  if (dim < 0 || dim >= getType().getRank())
    return emitOpError() << "dim must be in [0, " << getType().getRank()
                         << "), got " << dim;
  if (!getType().getElementType().isInteger(32))
    return emitOpError() << "iota tiles are i32, got " << getType();
  return success();
}

LogicalResult GatherOp::verify() {
  if (!getIndex().getType().getElementType().isInteger(32))
    return emitOpError() << "indices are i32, got " << getIndex().getType();
  if (getType().getShape() != getIndex().getType().getShape() ||
      getType().getElementType() != getBase().getType().getElementType())
    return emitOpError() << "the result must be the index tile's shape in "
                            "the buffer's element type, got "
                         << getType();
  return success();
}

LogicalResult ScatterAddOp::verify() {
  auto value = cast<RankedTensorType>(getValue().getType());
  auto index = cast<RankedTensorType>(getIndex().getType());
  if (!index.getElementType().isInteger(32))
    return emitOpError() << "indices are i32, got " << index;
  if (value.getShape() != index.getShape() ||
      value.getElementType() != getBase().getType().getElementType())
    return emitOpError() << "the value must be the index tile's shape in the "
                            "buffer's element type, got "
                         << value;
  return success();
}

LogicalResult ScatterOp::verify() {
  auto value = cast<RankedTensorType>(getValue().getType());
  auto index = cast<RankedTensorType>(getIndex().getType());
  auto mask = cast<RankedTensorType>(getMask().getType());
  if (!index.getElementType().isInteger(32))
    return emitOpError() << "indices are i32, got " << index;
  if (!mask.getElementType().isInteger(1))
    return emitOpError() << "the mask is i1, got " << mask;
  if (value.getShape() != index.getShape() ||
      mask.getShape() != index.getShape() ||
      value.getElementType() != getBase().getType().getElementType())
    return emitOpError() << "the value and the mask must be the index tile's "
                            "shape, the value in the buffer's element type, "
                            "got "
                         << value << " and " << mask;
  return success();
}

LogicalResult flashjit::tile::verifyWritesOutput(Operation *kernel) {
  bool writes = false;
  kernel->walk([&](Operation *op) {
    StringRef name = op->getName().getStringRef();
    writes |= isa<StoreOp, AtomicAddOp, ScatterOp>(op) ||
              name == "memref.store" || name == "memref.atomic_rmw";
  });
  if (writes)
    return success();
  auto sym = kernel->getAttrOfType<StringAttr>("sym_name");
  return kernel->emitError()
         << "kernel @" << (sym ? sym.getValue() : StringRef("?"))
         << " writes no output (no tile.store, tile.atomic_add or memref "
            "store): an emptied body?";
}

#define GET_OP_CLASSES
#include "dialects/Tile/IR/TileOps.cpp.inc"
