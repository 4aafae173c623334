//===- AttnOps.cpp - The attn dialect's ops and verifiers -----------------===//

#include "dialects/Attn/IR/AttnDialect.h"
#include "kernels/AttentionSpec.h"

#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Parser/Parser.h"

#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace flashjit::attn;

#include "dialects/Attn/IR/AttnDialect.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/Attn/IR/AttnAttrs.cpp.inc"

void AttnDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/Attn/IR/AttnOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/Attn/IR/AttnAttrs.cpp.inc"
      >();
}

/// The roles a tiled function can have (KernelAttr's `role`).
static bool isKnownRole(StringRef role) {
  return role == "forward" || role == "forward_split" || role == "combine" ||
         role == "mask_blocks" || role == "mask_blocks_list" ||
         role == "preprocess" || role == "main" || role == "dq" ||
         role == "dq_convert" || role == "capture_convert";
}

/// KernelAttr's `score_mod`: "" (none), "custom" or a named variant (the
/// backward's functions carry their description's too).
static LogicalResult
verifyKernelScoreMod(function_ref<InFlightDiagnostic()> emitError,
                     StringRef scoreMod) {
  if (scoreMod.empty())
    return success();
  if (scoreMod == "custom")
    return success();
  try {
    flashjit::ScoreMod::parse(scoreMod.str());
  } catch (const flashjit::SpecError &e) {
    return emitError() << "#attn.kernel: score_mod must be \"custom\" or a "
                          "named variant: "
                       << e.what();
  }
  return success();
}

LogicalResult KernelAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                 StringRef role, int64_t headDimQk,
                                 int64_t headDimV, Type elementType,
                                 StringRef mask, int64_t gqa,
                                 int64_t sparseBlock, int64_t blockM,
                                 int64_t blockN, bool deterministic,
                                 StringRef scoreMod, StringRef maskMod) {
  if (!isKnownRole(role))
    return emitError() << "#attn.kernel: role must be \"forward\", "
                          "\"forward_split\", \"combine\", "
                          "\"mask_blocks\", \"mask_blocks_list\", "
                          "\"preprocess\", \"main\", \"dq\", "
                          "\"dq_convert\" or \"capture_convert\", got \""
                       << role << "\"";
  for (auto [name, v] :
       {std::pair<const char *, int64_t>{"head_dim_qk", headDimQk},
        {"head_dim_v", headDimV}})
    if (v < 1 || v > 512)
      return emitError() << "#attn.kernel: " << name
                         << " must be in [1, 512], got " << v;
  if (!elementType || (!elementType.isBF16() && !elementType.isF16()))
    return emitError() << "#attn.kernel: element_type must be bf16 or f16, got "
                       << elementType;
  if (mask != "none" && mask != "causal" && mask != "sliding_window")
    return emitError() << "#attn.kernel: mask must be \"none\", \"causal\" "
                          "or \"sliding_window\", got \""
                       << mask << "\"";
  if (gqa < 1)
    return emitError() << "#attn.kernel: gqa must be >= 1, got " << gqa;
  if (sparseBlock < 0)
    return emitError() << "#attn.kernel: sparse_block must be >= 0, got "
                       << sparseBlock;
  for (auto [name, v] : {std::pair<const char *, int64_t>{"block_m", blockM},
                         {"block_n", blockN}})
    if (v < 1 || v > 1024)
      return emitError() << "#attn.kernel: " << name
                         << " must be in [1, 1024], got " << v;
  if (sparseBlock > 0 && (sparseBlock % blockM || sparseBlock % blockN))
    return emitError() << "#attn.kernel: block_m (" << blockM
                       << ") and block_n (" << blockN
                       << ") must divide sparse_block (" << sparseBlock << ")";
  if (role == "dq" && !deterministic)
    return emitError() << "#attn.kernel: role \"dq\" (the separate dQ pass) "
                          "needs deterministic = true";
  if (role == "capture_convert" && !deterministic)
    return emitError() << "#attn.kernel: role \"capture_convert\" (captured "
                          "gradients in fixed point) needs deterministic = "
                          "true";
  if (role == "dq_convert" && deterministic)
    return emitError() << "#attn.kernel: role \"dq_convert\" (atomic dQ) "
                          "needs deterministic = false";
  if (!maskMod.empty() && maskMod != "custom")
    return emitError() << "#attn.kernel: mask_mod must be \"custom\" or "
                          "\"\", got \""
                       << maskMod << "\"";
  return verifyKernelScoreMod(emitError, scoreMod);
}

LogicalResult AttnDialect::verifyOperationAttribute(Operation *op,
                                                    NamedAttribute attr) {
  if (attr.getName() == "attn.kernel" && !isa<KernelAttr>(attr.getValue()))
    return op->emitError() << "attn.kernel must be an #attn.kernel<...>, got "
                           << attr.getValue();
  if (attr.getName() == "attn.arg_names") {
    auto names = dyn_cast<ArrayAttr>(attr.getValue());
    if (!names || !llvm::all_of(names, [](Attribute a) {
          auto s = dyn_cast<StringAttr>(a);
          return s && !s.getValue().empty();
        }))
      return op->emitError()
             << "attn.arg_names must be an array of non-empty strings";
  }
  return success();
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

/// The names of a score modifier's block arguments, in order; a mask
/// modifier's are the same without the score.
static constexpr const char *kScoreModArgs[] = {"score", "batch", "head",
                                                "q_idx", "kv_idx"};
static_assert(std::size(kScoreModArgs) == kScoreModIndexArgs);
static_assert(std::size(kScoreModArgs) - 1 == kMaskModIndexArgs);

/// The checks of a score_mod region: one block of (score: f32, batch,
/// head, q_idx, kv_idx: index, then any captured tensors: memref<?xf32>),
/// arith and math ops on scalars and memref.load of a captured tensor at
/// one index, ending in attn.yield of an f32. A mask_mod region (\p mask)
/// takes the same arguments without the score and yields an i1.
static LogicalResult verifyModifier(Operation *op, Region &region, bool mask) {
  const char *what = mask ? "mask_mod" : "score_mod";
  if (!region.hasOneBlock())
    return op->emitOpError() << what << " must have one block, got "
                             << region.getBlocks().size();
  Block &body = region.front();
  auto names = ArrayRef<const char *>(kScoreModArgs).drop_front(mask ? 1 : 0);
  // The message keeps the arguments' spelling that tools match on;
  // captured tensors follow in parentheses.
  auto signature = [&](const std::string &got) {
    return op->emitOpError()
           << what
           << (mask ? " must take (batch: index, head: index, q_idx: index, "
                      "kv_idx: index), got "
                    : " must take (score: f32, batch: index, head: index, "
                      "q_idx: index, kv_idx: index), got ")
           << got << " (then any captured tensors, memref<?xf32>)";
  };
  if (body.getNumArguments() < names.size())
    return signature(std::to_string(body.getNumArguments()) + " arguments");
  Builder b(op->getContext());
  auto captured = MemRefType::get({ShapedType::kDynamic}, b.getF32Type());
  for (auto [i, arg] : llvm::enumerate(body.getArguments())) {
    Type want = i >= names.size()              ? Type(captured)
                : StringRef(names[i]) == "score" ? Type(b.getF32Type())
                                                 : Type(b.getIndexType());
    if (arg.getType() == want)
      continue;
    std::string type;
    llvm::raw_string_ostream os(type);
    os << "'" << arg.getType() << "' for "
       << (i < names.size()
               ? std::string(names[i])
               : "captured tensor " + std::to_string(i - names.size()));
    return signature(type);
  }
  auto yield = body.empty() ? YieldOp() : dyn_cast<YieldOp>(body.back());
  if (!yield)
    return op->emitOpError() << what << " must end in attn.yield";
  Type yielded = yield.getValue().getType();
  if (mask ? !yielded.isInteger(1) : !yielded.isF32())
    return op->emitOpError()
           << what << " must yield " << (mask ? "an i1 (keep the score)"
                                              : "an f32 (the new score)")
           << ", got " << yielded;
  for (Operation &inner : body.without_terminator()) {
    if (auto load = dyn_cast<memref::LoadOp>(inner)) {
      auto arg = dyn_cast<BlockArgument>(load.getMemRef());
      if (!arg || arg.getOwner() != &body ||
          arg.getArgNumber() < names.size() || load.getIndices().size() != 1)
        return op->emitOpError() << what
                                 << ": memref.load reads a captured "
                                    "tensor (an argument after kv_idx) at "
                                    "one index";
      continue;
    }
    StringRef ns = inner.getDialect() ? inner.getDialect()->getNamespace() : "";
    if ((ns != "arith" && ns != "math") || inner.getNumRegions() != 0)
      return op->emitOpError()
             << what << " may hold only arith and math ops, got '"
             << inner.getName() << "' (and memref.load of a captured tensor)";
    for (Type t : inner.getResultTypes())
      if (!t.isIntOrIndexOrFloat())
        return op->emitOpError()
               << what << " computes on scalars only, got " << t << " from '"
               << inner.getName() << "'";
  }
  return success();
}

/// Both modifier regions of description \p op, where it has them.
template <typename OpT> static LogicalResult verifyModifiers(OpT op) {
  if (op.hasScoreMod() &&
      failed(verifyModifier(op, op.getScoreMod(), /*mask=*/false)))
    return failure();
  if (op.hasMaskMod() &&
      failed(verifyModifier(op, op.getMaskMod(), /*mask=*/true)))
    return failure();
  return success();
}

/// The named variant that \p region is (FlashFwdOp::namedScoreMod).
static std::optional<std::string> namedScoreModOf(MLIRContext *ctx,
                                                  Region &region) {
  if (region.empty())
    return "";
  // Every variant's builder puts its argument first, as an f32 constant:
  // try each kind with it, and compare with the region that one builds.
  Block &body = region.front();
  auto first = dyn_cast<arith::ConstantOp>(body.front());
  auto arg = first ? dyn_cast<FloatAttr>(first.getValue()) : nullptr;
  if (!arg || !arg.getType().isF32())
    return std::nullopt;
  for (flashjit::ScoreMod::Kind kind : flashjit::ScoreMod::kNamedKinds) {
    flashjit::AttentionSpec spec;
    try {
      spec.scoreMod =
          flashjit::ScoreMod::of(kind, arg.getValueAsDouble()).name();
    } catch (const flashjit::SpecError &) {
      continue; // not an argument of this kind
    }
    OwningOpRef<ModuleOp> built = parseSourceString<ModuleOp>(
        flashjit::attnModuleText(spec, "named"), ctx);
    auto fwd = built ? *built->getOps<FlashFwdOp>().begin() : FlashFwdOp();
    if (fwd && OperationEquivalence::isRegionEquivalentTo(
                   &fwd.getScoreMod(), &region,
                   OperationEquivalence::IgnoreLocations))
      return spec.scoreMod;
  }
  return std::nullopt;
}

std::optional<std::string> FlashFwdOp::namedScoreMod() {
  return namedScoreModOf(getContext(), getScoreMod());
}
std::optional<std::string> FlashBwdOp::namedScoreMod() {
  return namedScoreModOf(getContext(), getScoreMod());
}

LogicalResult FlashFwdOp::verify() {
  if (failed(verifyKernelDescription(*this)))
    return failure();
  return verifyModifiers(*this);
}
LogicalResult FlashBwdOp::verify() {
  if (failed(verifyKernelDescription(*this)) || failed(verifyModifiers(*this)))
    return failure();
  // A mask's captured tensors are read by a predicate: no gradient.
  int64_t scoreCaptures = capturedTensors(getScoreMod());
  int64_t grads = getCaptureGradsAttr().getInt();
  if (grads >= 0 && (grads >> scoreCaptures) != 0 && hasMaskMod())
    return emitOpError() << "capture_grads " << grads
                         << " names captured tensors past score_mod's "
                         << scoreCaptures
                         << " (a mask_mod's captured tensors take no "
                            "gradient)";
  return success();
}

#define GET_OP_CLASSES
#include "dialects/Attn/IR/AttnOps.cpp.inc"
