//===- TileToLoops.cpp - flashjit-lower-tile-to-loops ---------------------===//
//
/// \file
/// The CPU execution mode's lowering of the tile IR: bufferization by hand
/// (every tile value gets a memref.alloca of its static shape, hoisted to the
/// function's entry block) and loops over the elements. This file holds the
/// pass driver, the check that every op on tiles can be lowered, the buffers
/// and the control flow carrying tiles (scf.for, scf.if); the tile ops and
/// the elementwise ops are in TileToLoopsOps.cpp.
///
/// Functions without tiles (scalar scf / memref / arith) are left
/// unchanged.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToLoops.h"
#include "compiler/Conversion/Passes.h"

#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/TypeSwitch.h"

namespace flashjit::conversion {
#define GEN_PASS_DEF_LOWERTILETOLOOPS
#include "compiler/Conversion/Passes.h.inc"
} // namespace flashjit::conversion

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion::tiles;

static constexpr const char *kPass = "flashjit-lower-tile-to-loops";

//===----------------------------------------------------------------------===//
// What can be lowered
//===----------------------------------------------------------------------===//

bool conversion::tiles::isTileType(Type type) {
  auto t = dyn_cast<RankedTensorType>(type);
  return t && t.hasStaticShape() && (t.getRank() == 1 || t.getRank() == 2);
}

static bool isTensor(Type type) { return isa<TensorType>(type); }

static bool carriesTensor(Operation *op) {
  return llvm::any_of(op->getOperandTypes(), isTensor) ||
         llvm::any_of(op->getResultTypes(), isTensor);
}

bool conversion::tiles::isElementwiseOnTiles(Operation *op) {
  return op->hasTrait<OpTrait::Elementwise>() && op->getNumRegions() == 0 &&
         op->getNumResults() > 0 &&
         llvm::all_of(op->getResultTypes(),
                      [](Type t) { return isTileType(t); });
}

/// Emits the named error for \p op, which carries tiles but cannot be
/// lowered, and fails.
static InFlightDiagnostic cannotLower(Operation *op) {
  return op->emitError() << kPass << ": cannot lower '" << op->getName()
                         << "': ";
}

/// Checks one op that carries a tensor.
static LogicalResult checkOp(Operation *op) {
  for (Type t : llvm::concat<Type>(op->getOperandTypes(), op->getResultTypes()))
    if (isTensor(t) && !isTileType(t))
      return cannotLower(op) << "type " << t
                             << " is not a tile (a statically shaped tensor "
                                "of rank 1 or 2)";
  if (isa<tile::TileDialect>(op->getDialect()))
    return success();
  if (auto c = dyn_cast<arith::ConstantOp>(op)) {
    auto dense = dyn_cast<DenseElementsAttr>(c.getValue());
    if (!dense || !dense.isSplat())
      return cannotLower(op) << "only splat constant tiles are supported";
    return success();
  }
  if (isa<scf::ForOp, scf::IfOp>(op))
    return success();
  if (isa<scf::YieldOp>(op) && isa<scf::ForOp, scf::IfOp>(op->getParentOp()))
    return success();
  if (isElementwiseOnTiles(op))
    return success();
  return cannotLower(op) << "no lowering of this op on tiles";
}

LogicalResult conversion::tiles::checkLowerable(func::FuncOp func) {
  FunctionType type = func.getFunctionType();
  if (llvm::any_of(type.getInputs(), isTensor) ||
      llvm::any_of(type.getResults(), isTensor))
    return func.emitError() << kPass << ": function @" << func.getName()
                            << " takes or returns a tensor; tiles live only "
                               "inside a kernel body";
  WalkResult walk = func.walk<WalkOrder::PreOrder>([](Operation *op) {
    if (carriesTensor(op) && failed(checkOp(op)))
      return WalkResult::interrupt();
    return WalkResult::advance();
  });
  return failure(walk.wasInterrupted());
}

//===----------------------------------------------------------------------===//
// Buffers
//===----------------------------------------------------------------------===//

Value conversion::tiles::indexConst(OpBuilder &b, Location loc, int64_t v) {
  return arith::ConstantIndexOp::create(b, loc, v);
}

void conversion::tiles::forEachIndex(
    OpBuilder &b, Location loc, ArrayRef<int64_t> shape,
    function_ref<void(OpBuilder &, Location, ValueRange)> body) {
  SmallVector<Value> lbs, ubs, steps;
  for (int64_t d : shape) {
    lbs.push_back(indexConst(b, loc, 0));
    ubs.push_back(indexConst(b, loc, d));
    steps.push_back(indexConst(b, loc, 1));
  }
  scf::buildLoopNest(b, loc, lbs, ubs, steps, body);
}

TileLowering::TileLowering(func::FuncOp func)
    : func(func), allocBuilder(OpBuilder::atBlockBegin(&func.front())) {}

Value TileLowering::newBuffer(Type tileType) {
  auto t = cast<RankedTensorType>(tileType);
  // After the last one: the lowering inserts code before the entry block's
  // first op too.
  if (lastAlloca)
    allocBuilder.setInsertionPointAfter(lastAlloca);
  auto alloca = memref::AllocaOp::create(
      allocBuilder, func.getLoc(),
      MemRefType::get(t.getShape(), t.getElementType()));
  lastAlloca = alloca;
  return alloca;
}

Value TileLowering::defineBuffer(Value tile) {
  Value buf = newBuffer(tile.getType());
  buffers[tile] = buf;
  return buf;
}

Value TileLowering::buffer(Value tile) {
  if (Value buf = buffers.lookup(tile))
    return buf;
  // A splat: fill its buffer right after its definition (which dominates
  // every use).
  Value scalar = splats.lookup(tile);
  assert(scalar && "tile used before it was lowered");
  Operation *def = tile.getDefiningOp();
  OpBuilder b(def->getContext());
  b.setInsertionPointAfter(def);
  Value buf = defineBuffer(tile);
  forEachIndex(b, def->getLoc(),
               cast<RankedTensorType>(tile.getType()).getShape(),
               [&](OpBuilder &b, Location loc, ValueRange ivs) {
                 memref::StoreOp::create(b, loc, scalar, buf, ivs);
               });
  return buf;
}

Value TileLowering::reusableBuffer(Value operand, Operation *user,
                                   Type resultType) {
  Operation *def = operand.getDefiningOp();
  // scf results live in the loop's (or the if's) own buffers; a value from
  // outside the user's block may be read again (the user is in a loop).
  if (!def || isa<scf::ForOp, scf::IfOp>(def) || !operand.hasOneUse() ||
      def->getBlock() != user->getBlock() || operand.getType() != resultType)
    return nullptr;
  return buffers.lookup(operand);
}

Value TileLowering::element(OpBuilder &b, Location loc, Value tile,
                            ValueRange ivs) {
  if (Value scalar = splats.lookup(tile))
    return scalar;
  return memref::LoadOp::create(b, loc, buffer(tile), ivs);
}

void TileLowering::copy(OpBuilder &b, Location loc, Value src, Value dst) {
  forEachIndex(b, loc, cast<MemRefType>(dst.getType()).getShape(),
               [&](OpBuilder &b, Location loc, ValueRange ivs) {
                 Value v = memref::LoadOp::create(b, loc, src, ivs);
                 memref::StoreOp::create(b, loc, v, dst, ivs);
               });
}

//===----------------------------------------------------------------------===//
// Driver
//===----------------------------------------------------------------------===//

LogicalResult TileLowering::run() {
  for (Block &block : func.getBody())
    if (failed(lowerBlock(block)))
      return failure();
  // Every user of a replaced op's tiles is itself replaced: drop the uses
  // first, then erase.
  for (Operation *op : dead)
    op->dropAllReferences();
  for (Operation *op : llvm::reverse(dead))
    op->erase();
  WalkResult left = func.walk([](Operation *op) {
    if (carriesTensor(op)) {
      op->emitError() << kPass << ": internal error: '" << op->getName()
                      << "' still carries a tensor after the lowering";
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return failure(left.wasInterrupted());
}

LogicalResult TileLowering::lowerBlock(Block &block) {
  SmallVector<Operation *> ops;
  for (Operation &op : block)
    ops.push_back(&op);
  for (Operation *op : ops)
    if (failed(lowerOp(op)))
      return failure();
  return success();
}

LogicalResult TileLowering::lowerOp(Operation *op) {
  if (!carriesTensor(op)) {
    // Scalar code stays; tiles may live in its regions.
    for (Region &r : op->getRegions())
      for (Block &block : r)
        if (failed(lowerBlock(block)))
          return failure();
    return success();
  }
  // A yield of tiles is lowered by its scf.for / scf.if.
  if (isa<scf::YieldOp>(op))
    return success();
  OpBuilder b(op);
  bool handled = true;
  LogicalResult result =
      llvm::TypeSwitch<Operation *, LogicalResult>(op)
          .Case([&](scf::ForOp o) { return lowerFor(o); })
          .Case([&](scf::IfOp o) { return lowerIf(o); })
          .Case([&](tile::LoadOp o) { return lowerLoad(b, o), success(); })
          .Case([&](tile::StoreOp o) {
            lowerStore(b, o, o.getValue(), o.getBase(), o.getOffset(),
                       o.getRow0(), o.getRows(), o.getStride(), o.getGroup(),
                       o.getGroupStride(), /*atomic=*/false);
            return success();
          })
          .Case([&](tile::AtomicAddOp o) {
            lowerStore(b, o, o.getValue(), o.getBase(), o.getOffset(),
                       o.getRow0(), o.getRows(), o.getStride(), Value(),
                       Value(), /*atomic=*/true, o.getQuadOrder());
            return success();
          })
          .Case([&](tile::DotOp o) { return lowerDot(b, o), success(); })
          .Case([&](tile::ReduceOp o) { return lowerReduce(b, o), success(); })
          .Case([&](tile::BroadcastOp o) {
            return lowerBroadcast(b, o), success();
          })
          .Case([&](tile::SplatOp o) {
            splats[o.getResult()] = o.getValue();
            return success();
          })
          .Case([&](tile::IotaOp o) { return lowerIota(b, o), success(); })
          .Case([&](tile::GatherOp o) { return lowerGather(b, o), success(); })
          .Case([&](tile::ScatterAddOp o) {
            return lowerScatterAdd(b, o), success();
          })
          .Case(
              [&](tile::ScatterOp o) { return lowerScatter(b, o), success(); })
          .Case([&](arith::ConstantOp o) {
            return lowerConstant(b, o), success();
          })
          .Default([&](Operation *o) {
            if (!isElementwiseOnTiles(o)) {
              handled = false;
              return failure();
            }
            lowerElementwise(b, o);
            return success();
          });
  if (!handled)
    return cannotLower(op) << "no lowering of this op on tiles";
  if (failed(result))
    return failure();
  if (!isa<scf::ForOp, scf::IfOp>(op))
    dead.push_back(op);
  return success();
}

//===----------------------------------------------------------------------===//
// Control flow carrying tiles
//===----------------------------------------------------------------------===//

void TileLowering::copyYielded(OpBuilder &b, Location loc, ValueRange values,
                               ArrayRef<Value> dests) {
  SmallVector<std::pair<Value, Value>> copies;
  for (auto [value, dest] : llvm::zip_equal(values, dests)) {
    Value src = dest ? buffer(value) : Value();
    if (src && src != dest)
      copies.push_back({src, dest});
  }
  // The copies run in order; a source that an earlier copy overwrites (a
  // yield permuting iter_args) is saved into a temporary before any copy.
  llvm::DenseSet<Value> written;
  SmallVector<bool> saved;
  for (auto [src, dest] : copies) {
    saved.push_back(written.contains(src));
    written.insert(dest);
  }
  for (auto [copyPair, save] : llvm::zip_equal(copies, saved)) {
    if (!save)
      continue;
    Value &src = copyPair.first;
    auto type = cast<MemRefType>(src.getType());
    Value tmp = newBuffer(
        RankedTensorType::get(type.getShape(), type.getElementType()));
    copy(b, loc, src, tmp);
    src = tmp;
  }
  for (auto [src, dest] : copies)
    copy(b, loc, src, dest);
}

/// A loop carrying tiles gets one buffer per tile iter_arg: the init is
/// copied in before the loop, the body reads the buffer, the yielded tile is
/// copied back at the end of the body; scalar iter_args stay.
///
///   %r:2 = scf.for %i = %lo to %hi step %c1
///       iter_args(%o = %o0, %m = %m0) -> (tensor<64x64xf32>, f32) {
///     ...
///     scf.yield %o2, %m2 : tensor<64x64xf32>, f32
///   }
///
/// becomes
///
///   %O = memref.alloca() : memref<64x64xf32>   // in the entry block
///   <copy %o0's buffer into %O>
///   %r = scf.for %i = %lo to %hi step %c1 iter_args(%m = %m0) -> (f32) {
///     ...                                        // %o reads %O
///     <copy %o2's buffer into %O>
///     scf.yield %m2 : f32
///   }                                            // %r#0 is %O
LogicalResult TileLowering::lowerFor(scf::ForOp op) {
  OpBuilder b(op);
  Location loc = op.getLoc();
  SmallVector<Value> carried, scalarInits;
  for (Value init : op.getInitArgs()) {
    if (!isTensor(init.getType())) {
      carried.push_back(nullptr);
      scalarInits.push_back(init);
      continue;
    }
    Value buf = newBuffer(init.getType());
    copy(b, loc, buffer(init), buf);
    carried.push_back(buf);
  }
  auto newFor = scf::ForOp::create(
      b, loc, op.getLowerBound(), op.getUpperBound(), op.getStep(), scalarInits,
      [](OpBuilder &, Location, Value, ValueRange) {}, op.getUnsignedCmp());
  newFor->setDiscardableAttrs(op->getDiscardableAttrDictionary());
  Block *oldBody = op.getBody(), *newBody = newFor.getBody();
  op.getInductionVar().replaceAllUsesWith(newFor.getInductionVar());
  unsigned next = 0;
  for (auto [arg, buf] : llvm::zip_equal(op.getRegionIterArgs(), carried)) {
    if (buf)
      buffers[arg] = buf;
    else
      arg.replaceAllUsesWith(newFor.getRegionIterArgs()[next++]);
  }
  newBody->getOperations().splice(newBody->end(), oldBody->getOperations());
  if (failed(lowerBlock(*newBody)))
    return failure();

  auto yield = cast<scf::YieldOp>(newBody->getTerminator());
  b.setInsertionPoint(yield);
  copyYielded(b, yield.getLoc(), yield.getOperands(), carried);
  SmallVector<Value> scalars;
  for (auto [v, buf] : llvm::zip_equal(yield.getOperands(), carried))
    if (!buf)
      scalars.push_back(v);
  scf::YieldOp::create(b, yield.getLoc(), scalars);
  yield->erase();

  next = 0;
  for (auto [res, buf] : llvm::zip_equal(op.getResults(), carried)) {
    if (buf)
      buffers[res] = buf;
    else
      res.replaceAllUsesWith(newFor.getResult(next++));
  }
  dead.push_back(op);
  return success();
}

/// An scf.if yielding tiles writes one result buffer in each branch.
///
///   %t = scf.if %c -> (tensor<64xf32>) {
///     scf.yield %a : tensor<64xf32>
///   } else {
///     scf.yield %b : tensor<64xf32>
///   }
///
/// becomes
///
///   %T = memref.alloca() : memref<64xf32>        // in the entry block
///   scf.if %c {
///     <copy %a's buffer into %T>
///   } else {
///     <copy %b's buffer into %T>
///   }                                            // %t is %T
LogicalResult TileLowering::lowerIf(scf::IfOp op) {
  OpBuilder b(op);
  SmallVector<Value> results;
  SmallVector<Type> scalarTypes;
  for (Value res : op.getResults()) {
    if (isTensor(res.getType())) {
      results.push_back(newBuffer(res.getType()));
    } else {
      results.push_back(nullptr);
      scalarTypes.push_back(res.getType());
    }
  }
  bool hasElse = !op.getElseRegion().empty();
  auto newIf = scf::IfOp::create(b, op.getLoc(), scalarTypes, op.getCondition(),
                                 hasElse);
  newIf->setDiscardableAttrs(op->getDiscardableAttrDictionary());
  for (auto [from, to] :
       llvm::zip_equal(op->getRegions(), newIf->getRegions())) {
    to.takeBody(from);
    if (to.empty())
      continue;
    if (failed(lowerBlock(to.front())))
      return failure();
    auto yield = cast<scf::YieldOp>(to.front().getTerminator());
    b.setInsertionPoint(yield);
    copyYielded(b, yield.getLoc(), yield.getOperands(), results);
    SmallVector<Value> scalars;
    for (auto [v, buf] : llvm::zip_equal(yield.getOperands(), results))
      if (!buf)
        scalars.push_back(v);
    scf::YieldOp::create(b, yield.getLoc(), scalars);
    yield->erase();
  }
  unsigned next = 0;
  for (auto [res, buf] : llvm::zip_equal(op.getResults(), results)) {
    if (buf)
      buffers[res] = buf;
    else
      res.replaceAllUsesWith(newIf.getResult(next++));
  }
  dead.push_back(op);
  return success();
}

//===----------------------------------------------------------------------===//
// The pass
//===----------------------------------------------------------------------===//

namespace {
struct LowerTileToLoopsPass
    : public conversion::impl::LowerTileToLoopsBase<LowerTileToLoopsPass> {
  /// The CPU grid runs its programs on host threads with default stacks
  /// (8 MiB): a function whose tile buffers need more than kMaxStackBytes
  /// is a named error, not a stack overflow at run time.
  static constexpr int64_t kMaxStackBytes = int64_t(4) << 20;
  static LogicalResult checkStackBytes(func::FuncOp f) {
    int64_t bytes = 0;
    f.walk([&](memref::AllocaOp a) {
      MemRefType ty = a.getType();
      if (ty.hasStaticShape())
        bytes += ty.getNumElements() *
                 std::max<int64_t>(1, ty.getElementTypeBitWidth() / 8);
    });
    if (bytes <= kMaxStackBytes)
      return success();
    return f.emitError() << "the tiles of @" << f.getName() << " need " << bytes
                         << " bytes of stack; the CPU mode allows "
                         << kMaxStackBytes
                         << " (use a smaller block-m / block-n)";
  }

  void runOnOperation() override {
    SmallVector<func::FuncOp> funcs;
    getOperation().walk([&](func::FuncOp f) {
      if (!f.isExternal())
        funcs.push_back(f);
    });
    for (func::FuncOp f : funcs) {
      if (f->hasAttr("attn.kernel") && failed(tile::verifyWritesOutput(f))) {
        signalPassFailure();
        return;
      }
      if (failed(checkLowerable(f)) || failed(TileLowering(f).run()) ||
          failed(checkStackBytes(f))) {
        signalPassFailure();
        return;
      }
    }
  }
};
} // namespace
