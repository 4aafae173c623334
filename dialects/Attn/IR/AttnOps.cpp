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

/// Every diagnostic names the field and the value it got. Integer fields
/// are read signed (the generated getters are unsigned).
LogicalResult FlashFwdOp::verify() {
  int64_t dqk = getHeadDimQkAttr().getInt(), dv = getHeadDimVAttr().getInt();
  int64_t gqa = getGqaAttr().getInt(), sb = getSparseBlockAttr().getInt();
  auto checkDim = [&](StringRef field, int64_t v) -> LogicalResult {
    if (v < 1 || v > 512)
      return emitOpError() << field << " must be in [1, 512], got " << v;
    return success();
  };
  if (failed(checkDim("head_dim_qk", dqk)) ||
      failed(checkDim("head_dim_v", dv)))
    return failure();
  Type et = getElementType();
  if (!et.isBF16() && !et.isF16())
    return emitOpError() << "element_type must be bf16 or f16, got " << et;
  StringRef mask = getMask();
  if (mask != "none" && mask != "causal" && mask != "sliding_window")
    return emitOpError()
           << "mask must be \"none\", \"causal\" or \"sliding_window\", got \""
           << mask << "\"";
  if (gqa < 1)
    return emitOpError() << "gqa must be >= 1, got " << gqa;
  if (sb < 0)
    return emitOpError() << "sparse_block must be >= 0 (0 = dense), got "
                         << sb;
  return success();
}

#define GET_OP_CLASSES
#include "dialects/Attn/IR/AttnOps.cpp.inc"
