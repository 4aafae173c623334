//===- AttnOps.cpp - The attn dialect's ops and verifiers -----------------===//

#include "dialects/Attn/IR/AttnDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace flashjit::attn;

#include "dialects/Attn/IR/AttnDialect.cpp.inc"

void AttnDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/Attn/IR/AttnOps.cpp.inc"
      >();
}

/// The checks of every kernel description (attn.flash_fwd, attn.flash_bwd).
/// Every diagnostic names the field and the value it got. Integer fields
/// are read signed (the generated getters are unsigned).
template <typename OpT> static LogicalResult verifyKernelDescription(OpT op) {
  int64_t dqk = op.getHeadDimQkAttr().getInt();
  int64_t dv = op.getHeadDimVAttr().getInt();
  int64_t gqa = op.getGqaAttr().getInt(), sb = op.getSparseBlockAttr().getInt();
  auto checkDim = [&](StringRef field, int64_t v) -> LogicalResult {
    if (v < 1 || v > 512)
      return op.emitOpError() << field << " must be in [1, 512], got " << v;
    return success();
  };
  if (failed(checkDim("head_dim_qk", dqk)) ||
      failed(checkDim("head_dim_v", dv)))
    return failure();
  Type et = op.getElementType();
  if (!et.isBF16() && !et.isF16())
    return op.emitOpError() << "element_type must be bf16 or f16, got " << et;
  StringRef mask = op.getMask();
  if (mask != "none" && mask != "causal" && mask != "sliding_window")
    return op.emitOpError()
           << "mask must be \"none\", \"causal\" or \"sliding_window\", got \""
           << mask << "\"";
  if (gqa < 1)
    return op.emitOpError() << "gqa must be >= 1, got " << gqa;
  if (sb < 0)
    return op.emitOpError()
           << "sparse_block must be >= 0 (0 = dense), got " << sb;
  return success();
}

LogicalResult FlashFwdOp::verify() { return verifyKernelDescription(*this); }
LogicalResult FlashBwdOp::verify() { return verifyKernelDescription(*this); }

#define GET_OP_CLASSES
#include "dialects/Attn/IR/AttnOps.cpp.inc"
