//===- TileToLoopsOps.cpp - The tile ops and elementwise ops, as loops ----===//
//
/// \file
/// One routine per op family of the tile IR, each writing its result tile's
/// buffer (TileLowering::defineBuffer) with a loop nest over the elements,
/// exactly as TileOps.td defines the op: predicated rows, the dot's f32
/// accumulation in k order, the reductions in index order. Elementwise
/// arith / math ops on tiles are cloned on scalars.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToLoops.h"

#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/IRMapping.h"

#include <cmath>

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion::tiles;

/// Whether global row `row0 + r` is present, and the index of its first
/// element: offset + (row0 + r) * stride (rank 1: offset + row0 + r).
static std::pair<Value, Value> globalRow(OpBuilder &b, Location loc, Value r,
                                         Value offset, Value row0, Value rows,
                                         Value stride, Value group,
                                         Value groupStride) {
  Value row = arith::AddIOp::create(b, loc, row0, r);
  Value present =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::slt, row, rows);
  // A row group: row p is row p / G of head p % G (TileOps.td).
  Value seqRow = group ? arith::DivUIOp::create(b, loc, row, group) : row;
  Value first = stride ? arith::MulIOp::create(b, loc, seqRow, stride) : seqRow;
  if (group)
    first = arith::AddIOp::create(
        b, loc, first,
        arith::MulIOp::create(
            b, loc, arith::RemUIOp::create(b, loc, row, group), groupStride));
  return {present, arith::AddIOp::create(b, loc, offset, first)};
}

Value flashjit::conversion::buildQuadColumn(ImplicitLocOpBuilder &b,
                                            Value col) {
  auto cst = [&](int64_t v) {
    return arith::ConstantOp::create(b, b.getIntegerAttr(col.getType(), v))
        .getResult();
  };
  auto andI = [&](Value x, int64_t m) {
    return arith::AndIOp::create(b, x, cst(m)).getResult();
  };
  auto shl = [&](Value x, int64_t n) {
    return arith::ShLIOp::create(b, x, cst(n)).getResult();
  };
  auto shrU = [&](Value x, int64_t n) {
    return arith::ShRUIOp::create(b, x, cst(n)).getResult();
  };
  auto orI = [&](Value x, Value y) {
    return arith::OrIOp::create(b, x, y).getResult();
  };
  // (c & ~15) | ((c & 7) >> 1) << 2 | ((c >> 3) & 1) << 1 | (c & 1).
  Value group = andI(col, ~int64_t(15));
  Value pair = shl(shrU(andI(col, 7), 1), 2);
  Value half = shl(andI(shrU(col, 3), 1), 1);
  return orI(orI(group, pair), orI(half, andI(col, 1)));
}

/// Column \p c's place in a row of `quad_order`, at \p loc.
static Value quadColumn(OpBuilder &b, Location loc, Value c) {
  ImplicitLocOpBuilder ib(loc, b);
  return flashjit::conversion::buildQuadColumn(ib, c);
}

/// Rows past the end read as zeros, without touching memory.
///
///   %t = tile.load %K[%off] rows %n0 of %n stride %s
///       : memref<?xbf16> -> tensor<64x96xbf16>
///
/// becomes
///
///   scf.for %r = %c0 to %c64 step %c1 {
///     %row = arith.addi %n0, %r
///     %in = arith.cmpi slt, %row, %n
///     scf.if %in {
///       scf.for %c ... { memref.load %K[%off + %row * %s + %c]; memref.store }
///     } else {
///       scf.for %c ... { memref.store %zero, %T[%r, %c] }
///     }
///   }
void TileLowering::lowerLoad(OpBuilder &b, tile::LoadOp op) {
  Location loc = op.getLoc();
  RankedTensorType type = op.getType();
  Value buf = defineBuffer(op.getResult());
  Value zero =
      arith::ConstantOp::create(b, loc, b.getZeroAttr(type.getElementType()));
  ArrayRef<int64_t> cols = type.getShape().drop_front();
  forEachIndex(
      b, loc, type.getDimSize(0),
      [&](OpBuilder &b, Location loc, ValueRange r) {
        auto [present, first] =
            globalRow(b, loc, r[0], op.getOffset(), op.getRow0(), op.getRows(),
                      op.getStride(), op.getGroup(), op.getGroupStride());
        // Writes each column of row r: from memory, or zeros.
        auto fillRow = [&](bool fromMemory) {
          return [&, fromMemory](OpBuilder &b, Location loc) {
            auto write = [&](OpBuilder &b, Location loc, ValueRange c) {
              SmallVector<Value> at{r[0]};
              Value v = zero;
              if (fromMemory) {
                Value idx = first;
                if (!c.empty()) {
                  idx = arith::AddIOp::create(
                      b, loc, first,
                      op.getQuadOrder() ? quadColumn(b, loc, c[0]) : c[0]);
                  at.push_back(c[0]);
                }
                v = memref::LoadOp::create(b, loc, op.getBase(), idx);
              } else if (!c.empty()) {
                at.push_back(c[0]);
              }
              memref::StoreOp::create(b, loc, v, buf, at);
            };
            if (cols.empty())
              write(b, loc, {});
            else
              forEachIndex(b, loc, cols, write);
            scf::YieldOp::create(b, loc);
          };
        };
        scf::IfOp::create(b, loc, present, fillRow(true), fillRow(false));
      });
}

/// Rows past the end are not written; atomic_add adds each element with
/// memref.atomic_rmw (the host threads of the CPU grid add at once).
///
///   tile.atomic_add %t, %A[%off] rows %m0 of %m stride %s
///       : tensor<64x128xf32>, memref<?xf32>
///
/// becomes
///
///   scf.for %r = %c0 to %c64 step %c1 {
///     %in = arith.cmpi slt, %m0 + %r, %m
///     scf.if %in {
///       scf.for %c ... {
///         %v = memref.load %T[%r, %c]
///         memref.atomic_rmw addf %v, %A[%off + (%m0 + %r) * %s + %c]
///       }
///     }
///   }
///
/// (tile.store: memref.store in place of the atomic_rmw. With `quad_order`
/// the column added at is quadColumn(%c), and a tile.load reads there.)
void TileLowering::lowerStore(OpBuilder &b, Operation *op, Value value,
                              Value base, Value offset, Value row0, Value rows,
                              Value stride, Value group, Value groupStride,
                              bool atomic, bool quadOrder) {
  auto type = cast<RankedTensorType>(value.getType());
  ArrayRef<int64_t> cols = type.getShape().drop_front();
  forEachIndex(
      b, op->getLoc(), type.getDimSize(0),
      [&](OpBuilder &b, Location loc, ValueRange r) {
        auto [present, first] = globalRow(b, loc, r[0], offset, row0, rows,
                                          stride, group, groupStride);
        scf::IfOp::create(b, loc, present, [&](OpBuilder &b, Location loc) {
          auto write = [&](OpBuilder &b, Location loc, ValueRange c) {
            SmallVector<Value> at{r[0]};
            Value idx = first;
            if (!c.empty()) {
              at.push_back(c[0]);
              idx = arith::AddIOp::create(
                  b, loc, first, quadOrder ? quadColumn(b, loc, c[0]) : c[0]);
            }
            Value v = element(b, loc, value, at);
            if (atomic)
              memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addf, v,
                                          base, idx);
            else
              memref::StoreOp::create(b, loc, v, base, idx);
          };
          if (cols.empty())
            write(b, loc, {});
          else
            forEachIndex(b, loc, cols, write);
          scf::YieldOp::create(b, loc);
        });
      });
}

/// One f32 accumulator per output element, the products added in order
/// k = 0..K-1 starting from acc (or 0). The j loop is innermost (each
/// element's sum keeps its order; LLVM vectorizes over j); a transposed rhs
/// is first staged as K x N f32 so that the j loop reads it contiguously.
///
///   %o = tile.dot %p, %v acc %o0 : tensor<64x96xf32>
///       : tensor<64x32xbf16>, tensor<32x96xbf16> -> tensor<64x96xf32>
///
/// becomes
///
///   <%O[i, j] = %o0[i, j]>                    (0.0 without acc)
///   scf.for %i ... { scf.for %k ... {
///     %a = arith.extf %P[%i, %k] : bf16 to f32      (%P[%k, %i] transposed)
///     scf.for %j ... {
///       %b = arith.extf %V[%k, %j] : bf16 to f32    (%V[%j, %k] transposed)
///       %O[%i, %j] = arith.addf %O[%i, %j], arith.mulf %a, %b
///   } } }
void TileLowering::lowerDot(OpBuilder &b, tile::DotOp op) {
  Location loc = op.getLoc();
  RankedTensorType res = op.getType();
  Type f32 = b.getF32Type();
  int64_t m = res.getDimSize(0), n = res.getDimSize(1);
  int64_t k = op.getLhs().getType().getDimSize(op.getTransposeLhs() ? 0 : 1);
  // The sum accumulates in the result's buffer: acc's own where it dies here.
  Value out = op.getAcc() ? reusableBuffer(op.getAcc(), op, res) : Value();
  if (out) {
    buffers[op.getResult()] = out;
  } else {
    out = defineBuffer(op.getResult());
    Value zero = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0.0f));
    forEachIndex(
        b, loc, {m, n}, [&](OpBuilder &b, Location loc, ValueRange ij) {
          Value init = op.getAcc() ? element(b, loc, op.getAcc(), ij) : zero;
          memref::StoreOp::create(b, loc, init, out, ij);
        });
  }
  auto toF32 = [&](OpBuilder &b, Location loc, Value v) -> Value {
    return v.getType() == f32 ? v : arith::ExtFOp::create(b, loc, f32, v);
  };
  // A transposed rhs is staged once as K x N f32, so that the j loop reads
  // contiguous elements (the values, hence the sums, are the same).
  Value rhs = op.getRhs(), staged;
  bool tr = op.getTransposeRhs();
  if (tr && !splats.lookup(rhs)) {
    staged = newBuffer(RankedTensorType::get({k, n}, f32));
    forEachIndex(b, loc, {k, n},
                 [&](OpBuilder &b, Location loc, ValueRange kj) {
                   SmallVector<Value, 2> at{kj[0], kj[1]};
                   if (tr)
                     std::swap(at[0], at[1]);
                   Value v = toF32(b, loc, element(b, loc, rhs, at));
                   memref::StoreOp::create(b, loc, v, staged, kj);
                 });
  }
  forEachIndex(b, loc, {m, k}, [&](OpBuilder &b, Location loc, ValueRange ik) {
    Value i = ik[0], kk = ik[1];
    SmallVector<Value, 2> lhsAt{i, kk};
    if (op.getTransposeLhs())
      std::swap(lhsAt[0], lhsAt[1]);
    Value a = toF32(b, loc, element(b, loc, op.getLhs(), lhsAt));
    forEachIndex(b, loc, n, [&](OpBuilder &b, Location loc, ValueRange j) {
      SmallVector<Value, 2> rhsAt{kk, j[0]}, outAt{i, j[0]};
      Value bv;
      if (staged) {
        bv = memref::LoadOp::create(b, loc, staged, rhsAt);
      } else {
        if (op.getTransposeRhs())
          std::swap(rhsAt[0], rhsAt[1]);
        bv = toF32(b, loc, element(b, loc, rhs, rhsAt));
      }
      Value prod = arith::MulFOp::create(b, loc, a, bv);
      Value acc = memref::LoadOp::create(b, loc, out, outAt);
      Value sum = arith::AddFOp::create(b, loc, acc, prod);
      memref::StoreOp::create(b, loc, sum, out, outAt);
    });
  });
}

/// "max" folds arith.maxnumf from -inf, "sum" arith.addf from 0.0, both in
/// index order.
///
///   %mx = tile.reduce "max" %s dim 1 : tensor<64x32xf32> -> tensor<64xf32>
///
/// becomes
///
///   scf.for %r ... {
///     %m = scf.for %c ... iter_args(%a = %ninf) -> (f32) {
///       scf.yield arith.maxnumf %a, %S[%r, %c]
///     }
///     memref.store %m, %MX[%r]
///   }
///
/// (dim 0: %MX[%c] = -inf, then %MX[%c] = maxnumf(%MX[%c], %S[%r, %c]) with
/// %c innermost.)
void TileLowering::lowerReduce(OpBuilder &b, tile::ReduceOp op) {
  Location loc = op.getLoc();
  bool isMax = op.getKind() == "max";
  auto in = op.getValue().getType();
  int64_t rows = in.getDimSize(0), cols = in.getDimSize(1);
  Value out = defineBuffer(op.getResult());
  Value init = arith::ConstantOp::create(
      b, loc, b.getF32FloatAttr(isMax ? -INFINITY : 0.0f));
  auto combine = [&](OpBuilder &b, Location loc, Value acc, Value x) -> Value {
    if (isMax)
      return arith::MaxNumFOp::create(b, loc, acc, x);
    return arith::AddFOp::create(b, loc, acc, x);
  };
  if (op.getDim() == 1) {
    forEachIndex(b, loc, rows, [&](OpBuilder &b, Location loc, ValueRange r) {
      auto loop = scf::ForOp::create(
          b, loc, indexConst(b, loc, 0), indexConst(b, loc, cols),
          indexConst(b, loc, 1), ValueRange(init),
          [&](OpBuilder &b, Location loc, Value c, ValueRange acc) {
            SmallVector<Value, 2> at{r[0], c};
            Value x = element(b, loc, op.getValue(), at);
            scf::YieldOp::create(b, loc, combine(b, loc, acc[0], x));
          });
      memref::StoreOp::create(b, loc, loop.getResult(0), out, r);
    });
    return;
  }
  forEachIndex(b, loc, cols, [&](OpBuilder &b, Location loc, ValueRange c) {
    memref::StoreOp::create(b, loc, init, out, c);
  });
  forEachIndex(
      b, loc, {rows, cols}, [&](OpBuilder &b, Location loc, ValueRange rc) {
        Value acc = memref::LoadOp::create(b, loc, out, rc[1]);
        Value x = element(b, loc, op.getValue(), rc);
        memref::StoreOp::create(b, loc, combine(b, loc, acc, x), out, rc[1]);
      });
}

/// dim 1 repeats a per-row value over the columns, dim 0 a per-column value
/// over the rows.
///
///   %mb = tile.broadcast %m dim 1 : tensor<64xf32> -> tensor<64x32xf32>
///
/// becomes
///
///   scf.for %r ... { scf.for %c ... {
///     memref.store (memref.load %M[%r]), %MB[%r, %c]
///   } }
void TileLowering::lowerBroadcast(OpBuilder &b, tile::BroadcastOp op) {
  Value out = defineBuffer(op.getResult());
  bool perRow = op.getDim() == 1;
  forEachIndex(b, op.getLoc(), op.getType().getShape(),
               [&](OpBuilder &b, Location loc, ValueRange rc) {
                 Value v =
                     element(b, loc, op.getValue(), perRow ? rc[0] : rc[1]);
                 memref::StoreOp::create(b, loc, v, out, rc);
               });
}

/// The row (dim 0) or column (dim 1) index of each element, as i32.
///
///   %cols = tile.iota dim 1 : tensor<64x32xi32>
///
/// becomes
///
///   scf.for %r ... { scf.for %c ... {
///     memref.store (arith.index_cast %c : index to i32), %COLS[%r, %c]
///   } }
void TileLowering::lowerIota(OpBuilder &b, tile::IotaOp op) {
  Value out = defineBuffer(op.getResult());
  int64_t dim = op.getDim();
  Type et = op.getType().getElementType();
  forEachIndex(b, op.getLoc(), op.getType().getShape(),
               [&](OpBuilder &b, Location loc, ValueRange ivs) {
                 Value v = arith::IndexCastOp::create(b, loc, et, ivs[dim]);
                 memref::StoreOp::create(b, loc, v, out, ivs);
               });
}

/// Each element from the buffer at its index (a captured tensor's load).
///
///   %g = tile.gather %t[%idx] : memref<?xf32>, tensor<64x32xi32>
///       -> tensor<64x32xf32>
///
/// becomes
///
///   scf.for %r ... { scf.for %c ... {
///     %i = arith.index_cast (memref.load %IDX[%r, %c]) : i32 to index
///     memref.store (memref.load %t[%i]), %G[%r, %c]
///   } }
void TileLowering::lowerGather(OpBuilder &b, tile::GatherOp op) {
  Value out = defineBuffer(op.getResult());
  forEachIndex(
      b, op.getLoc(), op.getType().getShape(),
      [&](OpBuilder &b, Location loc, ValueRange ivs) {
        Value i = arith::IndexCastOp::create(
            b, loc, b.getIndexType(), element(b, loc, op.getIndex(), ivs));
        Value v = memref::LoadOp::create(b, loc, op.getBase(), ValueRange{i});
        memref::StoreOp::create(b, loc, v, out, ivs);
      });
}

/// Each element added into the buffer at its index, atomically (the host
/// threads of the CPU grid add at once): a captured tensor's gradient; an
/// i64 tile (a deterministic gradient's fixed-point word) by integer adds.
///
///   tile.scatter_add %g, %dt[%idx]
///       : tensor<64x32xf32>, memref<?xf32>, tensor<64x32xi32>
///
/// becomes
///
///   scf.for %r ... { scf.for %c ... {
///     %i = arith.index_cast (memref.load %IDX[%r, %c]) : i32 to index
///     memref.atomic_rmw addf (memref.load %G[%r, %c]), %dt[%i]
///   } }
///
/// (i64: `scf.if %v != 0 { memref.atomic_rmw addi ... }`).
void TileLowering::lowerScatterAdd(OpBuilder &b, tile::ScatterAddOp op) {
  const bool integer = op.getBase().getType().getElementType().isInteger(64);
  forEachIndex(
      b, op.getLoc(), cast<RankedTensorType>(op.getValue().getType()).getShape(),
      [&](OpBuilder &b, Location loc, ValueRange ivs) {
        Value i = arith::IndexCastOp::create(
            b, loc, b.getIndexType(), element(b, loc, op.getIndex(), ivs));
        Value v = element(b, loc, op.getValue(), ivs);
        if (!integer) {
          memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addf, v,
                                      op.getBase(), ValueRange{i});
          return;
        }
        // An integer 0 adds nothing: no atomic (one address many add 0 to).
        Value zero = arith::ConstantIntOp::create(b, loc, v.getType(), 0);
        auto nonzero = scf::IfOp::create(
            b, loc,
            arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ne, v, zero),
            /*withElseRegion=*/false);
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(nonzero.thenBlock());
        memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi, v,
                                    op.getBase(), ValueRange{i});
      });
}

/// Each element whose mask holds written at its index (a mask's block
/// classification listing its kept blocks).
///
///   tile.scatter %e, %IDX[%pos] if %kept
///       : tensor<4xi32>, memref<?xi32>, tensor<4xi32>, tensor<4xi1>
///
/// becomes
///
///   scf.for %r ... {
///     scf.if (memref.load %KEPT[%r]) {
///       %i = arith.index_cast (memref.load %POS[%r]) : i32 to index
///       memref.store (memref.load %E[%r]), %IDX[%i]
///   } }
void TileLowering::lowerScatter(OpBuilder &b, tile::ScatterOp op) {
  forEachIndex(
      b, op.getLoc(),
      cast<RankedTensorType>(op.getValue().getType()).getShape(),
      [&](OpBuilder &b, Location loc, ValueRange ivs) {
        auto kept =
            scf::IfOp::create(b, loc, element(b, loc, op.getMask(), ivs),
                              /*withElseRegion=*/false);
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(kept.thenBlock());
        Value i = arith::IndexCastOp::create(
            b, loc, b.getIndexType(), element(b, loc, op.getIndex(), ivs));
        memref::StoreOp::create(b, loc, element(b, loc, op.getValue(), ivs),
                                op.getBase(), ValueRange{i});
      });
}

/// A splat constant tile is its scalar (like tile.splat): elementwise users
/// take the scalar; a buffer is filled only where an op needs one.
///
///   %z = arith.constant dense<0.0> : tensor<64x96xf32>
///
/// becomes
///
///   %z = arith.constant 0.0 : f32
void TileLowering::lowerConstant(OpBuilder &b, arith::ConstantOp op) {
  auto dense = cast<DenseElementsAttr>(op.getValue());
  splats[op.getResult()] = arith::ConstantOp::create(
      b, op.getLoc(), cast<TypedAttr>(dense.getSplatValue<Attribute>()));
}

/// Any ElementwiseMappable op on tiles is cloned on scalars in a loop nest
/// over the result (scalar operands, such as a select's i1 condition, are
/// used as they are).
///
///   %e = math.exp2 %x : tensor<64x32xf32>
///
/// becomes
///
///   scf.for %r ... { scf.for %c ... {
///     %v = math.exp2 (memref.load %X[%r, %c]) : f32
///     memref.store %v, %E[%r, %c]
///   } }
void TileLowering::lowerElementwise(OpBuilder &b, Operation *op) {
  SmallVector<Value> outs;
  for (Value res : op->getResults()) {
    // In place where an operand dies here: element ivs is read before it is
    // written.
    Value reused;
    if (op->getNumResults() == 1)
      for (Value operand : op->getOperands())
        if ((reused = reusableBuffer(operand, op, res.getType())))
          break;
    if (reused)
      buffers[res] = reused;
    outs.push_back(reused ? reused : defineBuffer(res));
  }
  auto shape = cast<RankedTensorType>(op->getResult(0).getType()).getShape();
  forEachIndex(
      b, op->getLoc(), shape, [&](OpBuilder &b, Location loc, ValueRange ivs) {
        IRMapping map;
        for (Value operand : op->getOperands())
          if (isTileType(operand.getType()))
            map.map(operand, element(b, loc, operand, ivs));
        Operation *scalar = b.clone(*op, map);
        for (auto [res, out] : llvm::zip_equal(scalar->getResults(), outs)) {
          res.setType(cast<RankedTensorType>(res.getType()).getElementType());
          memref::StoreOp::create(b, loc, res, out, ivs);
        }
      });
}
