//===- GpuBuilder.cpp - Warp-level building blocks for GPU kernels --------===//

#include "compiler/Conversion/GpuBuilder.h"

using namespace mlir;

namespace flashjit::gpu {

GpuBuilder::GpuBuilder(ImplicitLocOpBuilder &b, Elem elem) : b(b), elem(elem) {
  MLIRContext *ctx = b.getContext();
  i1 = b.getI1Type();
  i16 = b.getI16Type();
  i32 = b.getI32Type();
  i64 = b.getI64Type();
  f32 = b.getF32Type();
  halfTy = elem == Elem::BF16 ? Type(b.getBF16Type()) : Type(b.getF16Type());
  ptrGen = LLVM::LLVMPointerType::get(ctx);
  ptrGlobal = LLVM::LLVMPointerType::get(ctx, 1);
  ptrShared = LLVM::LLVMPointerType::get(ctx, 3);
}

Value GpuBuilder::c32(int64_t v) {
  return arith::ConstantOp::create(b, b.getI32IntegerAttr(int32_t(v)));
}
Value GpuBuilder::c64(int64_t v) {
  return arith::ConstantOp::create(b, b.getI64IntegerAttr(v));
}
Value GpuBuilder::cf(double v) {
  return arith::ConstantOp::create(b, b.getF32FloatAttr(float(v)));
}

Value GpuBuilder::cBool(bool v) {
  return arith::ConstantOp::create(b, b.getBoolAttr(v));
}

Value GpuBuilder::clampTo32(Value x) {
  return trunc32(
      minS(maxS(x, c64(-(int64_t(1) << 30))), c64(int64_t(1) << 30)));
}

Value GpuBuilder::intrinsic(StringRef name, TypeRange results,
                            ValueRange args) {
  auto op = LLVM::CallIntrinsicOp::create(b, results, b.getStringAttr(name),
                                          args, LLVM::FastmathFlagsAttr());
  return op.getNumResults() ? op.getResult(0) : Value();
}

Value GpuBuilder::extract(Value aggregate, int64_t i) {
  return LLVM::ExtractValueOp::create(b, aggregate, ArrayRef<int64_t>{i});
}

Value GpuBuilder::exp2(Value x) {
  return intrinsic("llvm.nvvm.ex2.approx.ftz.f32", {f32}, {x});
}
Value GpuBuilder::log2(Value x) {
  return intrinsic("llvm.nvvm.lg2.approx.ftz.f", {f32}, {x});
}
Value GpuBuilder::fromLane0(Value x) {
  return intrinsic("llvm.nvvm.shfl.sync.idx.i32", {i32},
                   {c32(-1), x, c32(0), c32(31)});
}
Value GpuBuilder::shuffleXor(Value x, int64_t laneMask) {
  if (x.getType() == i64) {
    // Two 32-bit shuffles: the low and the high word.
    auto half = [&](Value w) {
      return intrinsic("llvm.nvvm.shfl.sync.bfly.i32", {i32},
                       {c32(-1), w, c32(laneMask), c32(31)});
    };
    Value lo = half(arith::TruncIOp::create(b, i32, x));
    Value hi = half(
        arith::TruncIOp::create(b, i32, arith::ShRUIOp::create(b, x, c64(32))));
    return arith::OrIOp::create(
        b, arith::ExtUIOp::create(b, i64, lo),
        arith::ShLIOp::create(b, arith::ExtUIOp::create(b, i64, hi), c64(32)));
  }
  return intrinsic("llvm.nvvm.shfl.sync.bfly.f32", {f32},
                   {c32(-1), x, c32(laneMask), c32(31)});
}

Value GpuBuilder::opaque(Value x) {
  auto op = LLVM::InlineAsmOp::create(
      b, i32, ValueRange{x}, "mov.b32 $0, $1;", "=r,r",
      /*has_side_effects=*/true, /*is_align_stack=*/false,
      LLVM::tailcallkind::TailCallKind::None, LLVM::AsmDialectAttr(),
      ArrayAttr());
  return op.getResult(0);
}

/// Emits the side-effecting PTX \p text on \p operands.
static void sideEffectAsm(GpuBuilder &g, StringRef text, StringRef constraints,
                          ValueRange operands) {
  LLVM::InlineAsmOp::create(g.b, TypeRange(), operands, text, constraints,
                            /*has_side_effects=*/true,
                            /*is_align_stack=*/false,
                            LLVM::tailcallkind::TailCallKind::None,
                            LLVM::AsmDialectAttr(), ArrayAttr());
}

void GpuBuilder::reduceAdd(Value pred, Value ptr, Value v) {
  Value addr = LLVM::PtrToIntOp::create(b, i64, toGlobal(ptr));
  const bool integer = v.getType() == i64;
  if (!pred) {
    sideEffectAsm(*this,
                  integer ? "red.global.add.u64 [$0], $1;"
                          : "red.global.add.f32 [$0], $1;",
                  integer ? "l,l" : "l,f", {addr, v});
    return;
  }
  sideEffectAsm(*this,
                integer ? "{ .reg .pred p; setp.ne.b32 p, $0, 0; "
                          "@p red.global.add.u64 [$1], $2; }"
                        : "{ .reg .pred p; setp.ne.b32 p, $0, 0; "
                          "@p red.global.add.f32 [$1], $2; }",
                integer ? "r,l,l" : "r,l,f",
                {arith::ExtUIOp::create(b, i32, pred), addr, v});
}

void GpuBuilder::reduceAdd4(Value pred, Value ptr, ArrayRef<Value> v) {
  Value addr = LLVM::PtrToIntOp::create(b, i64, toGlobal(ptr));
  if (!pred) {
    sideEffectAsm(*this, "red.global.add.v4.f32 [$0], {$1, $2, $3, $4};",
                  "l,f,f,f,f", {addr, v[0], v[1], v[2], v[3]});
    return;
  }
  sideEffectAsm(
      *this,
      "{ .reg .pred p; setp.ne.b32 p, $0, 0; "
      "@p red.global.add.v4.f32 [$1], {$2, $3, $4, $5}; }",
      "r,l,f,f,f,f",
      {arith::ExtUIOp::create(b, i32, pred), addr, v[0], v[1], v[2], v[3]});
}

void GpuBuilder::reduceAdd2(Value pred, Value ptr, Value v0, Value v1) {
  Value addr = LLVM::PtrToIntOp::create(b, i64, toGlobal(ptr));
  if (!pred) {
    sideEffectAsm(*this, "red.global.add.v2.f32 [$0], {$1, $2};", "l,f,f",
                  {addr, v0, v1});
    return;
  }
  sideEffectAsm(*this,
                "{ .reg .pred p; setp.ne.b32 p, $0, 0; "
                "@p red.global.add.v2.f32 [$1], {$2, $3}; }",
                "r,l,f,f",
                {arith::ExtUIOp::create(b, i32, pred), addr, v0, v1});
}

void GpuBuilder::bulkReduceAdd(Value pred, Value dst, Value src, Value bytes) {
  Value addr = LLVM::PtrToIntOp::create(b, i64, toGlobal(dst));
  sideEffectAsm(*this,
                "{ .reg .pred p; setp.ne.b32 p, $0, 0; "
                "@p cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 "
                "[$1], [$2], $3; }",
                "r,l,r,r,~{memory}",
                {arith::ExtUIOp::create(b, i32, pred), addr,
                 LLVM::PtrToIntOp::create(b, i32, src), bytes});
}

void GpuBuilder::bulkCommit() {
  sideEffectAsm(*this, "cp.async.bulk.commit_group;", "~{memory}", {});
}

void GpuBuilder::bulkWait(int64_t pending, bool read) {
  sideEffectAsm(*this,
                std::string("cp.async.bulk.wait_group") +
                    (read ? ".read " : " ") + std::to_string(pending) + ";",
                "~{memory}", {});
}

void GpuBuilder::barrier() {
  if (!barrierThreads) {
    mlir::gpu::BarrierOp::create(b);
    return;
  }
  sideEffectAsm(*this, "bar.sync 1, " + std::to_string(barrierThreads) + ";",
                "~{memory}", {});
}

void GpuBuilder::namedBarrierSync(Value id, int64_t threads) {
  sideEffectAsm(*this, "bar.sync $0, " + std::to_string(threads) + ";",
                "r,~{memory}", {id});
}

void GpuBuilder::namedBarrierArrive(Value id, int64_t threads) {
  sideEffectAsm(*this, "bar.arrive $0, " + std::to_string(threads) + ";",
                "r,~{memory}", {id});
}

void GpuBuilder::setMaxRegisters(int64_t count, bool increase) {
  sideEffectAsm(*this,
                std::string("setmaxnreg.") + (increase ? "inc" : "dec") +
                    ".sync.aligned.u32 " + std::to_string(count) + ";",
                "~{memory}", {});
}

/// The 32-bit address of shared pointer \p bar, an asm operand ("r").
static Value sharedAddress(GpuBuilder &g, Value bar) {
  return LLVM::PtrToIntOp::create(g.b, g.i32, bar);
}

void GpuBuilder::mbarrierInit(Value bar, int64_t count) {
  sideEffectAsm(*this, "mbarrier.init.shared::cta.b64 [$0], $1;",
                "r,r,~{memory}", {sharedAddress(*this, bar), c32(count)});
}

void GpuBuilder::mbarrierArrive(Value bar) {
  sideEffectAsm(*this,
                "{ .reg .b64 state; "
                "mbarrier.arrive.shared::cta.b64 state, [$0]; }",
                "r,~{memory}", {sharedAddress(*this, bar)});
}

void GpuBuilder::mbarrierArriveOnCopies(Value bar) {
  sideEffectAsm(*this, "cp.async.mbarrier.arrive.noinc.shared::cta.b64 [$0];",
                "r,~{memory}", {sharedAddress(*this, bar)});
}

void GpuBuilder::mbarrierWait(Value bar, Value parity) {
  // Braces scope the labels: the asm may be inlined many times.
  sideEffectAsm(*this,
                "{ .reg .pred done; "
                "flashjit_wait: "
                "mbarrier.try_wait.parity.shared::cta.b64 done, [$0], $1; "
                "@!done bra flashjit_wait; }",
                "r,r,~{memory}", {sharedAddress(*this, bar), parity});
}

void GpuBuilder::mbarrierExpectBytes(Value bar, int64_t bytes) {
  sideEffectAsm(*this, "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;",
                "r,r,~{memory}", {sharedAddress(*this, bar), c32(bytes)});
}

/// Emits TMA instruction \p opcode on the box at \p coords of tensor map
/// \p map, with shared operands: `opcode [dst], [map, {coords}], [last];`
/// (a copy in: \p dst, then its mbarrier \p last) or, with a null \p dst,
/// `opcode [map, {coords}], [last];` (a store out of \p last).
static void tensorBoxAsm(GpuBuilder &g, const std::string &opcode, Value dst,
                         Value map, ArrayRef<Value> coords, Value last) {
  std::string text = opcode + " ", constraints;
  SmallVector<Value> operands;
  if (dst) {
    text += "[$0], ";
    constraints = "r,";
    operands.push_back(sharedAddress(g, dst));
  }
  text += "[$" + std::to_string(operands.size()) + ", {";
  constraints += "l";
  operands.push_back(LLVM::PtrToIntOp::create(g.b, g.i64, map));
  for (auto [i, c] : llvm::enumerate(coords)) {
    text += (i ? ", $" : "$") + std::to_string(operands.size());
    constraints += ",r";
    operands.push_back(c);
  }
  text += "}], [$" + std::to_string(operands.size()) + "];";
  constraints += ",r,~{memory}";
  operands.push_back(sharedAddress(g, last));
  sideEffectAsm(g, text, constraints, operands);
}

void GpuBuilder::tensorCopy(Value dst, Value map, ArrayRef<Value> coords,
                            Value bar) {
  tensorBoxAsm(*this,
               "cp.async.bulk.tensor." + std::to_string(coords.size()) +
                   "d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
               dst, map, coords, bar);
}

void GpuBuilder::tensorStore(Value map, ArrayRef<Value> coords, Value src) {
  tensorBoxAsm(*this,
               "cp.async.bulk.tensor." + std::to_string(coords.size()) +
                   "d.global.shared::cta.tile.bulk_group",
               Value(), map, coords, src);
}

void GpuBuilder::prefetchTensorMap(Value map) {
  sideEffectAsm(*this, "prefetch.tensormap [$0];", "l",
                {LLVM::PtrToIntOp::create(b, i64, map)});
}

Value GpuBuilder::threadIdX() {
  Value t = mlir::gpu::ThreadIdOp::create(b, mlir::gpu::Dimension::x);
  return arith::IndexCastUIOp::create(b, i32, t);
}
Value GpuBuilder::blockId(mlir::gpu::Dimension dim) {
  Value t = mlir::gpu::BlockIdOp::create(b, dim);
  return arith::IndexCastUIOp::create(b, i32, t);
}

Value GpuBuilder::toGlobal(Value genericPtr) {
  return LLVM::AddrSpaceCastOp::create(b, ptrGlobal, genericPtr);
}
Value GpuBuilder::elementPtr(Value base, Value index) {
  return LLVM::GEPOp::create(b, base.getType(), i16, base,
                             ArrayRef<LLVM::GEPArg>{index});
}
Value GpuBuilder::loadElement(Value base, Value index) {
  Value bits = LLVM::LoadOp::create(b, i16, elementPtr(base, index));
  Value h = LLVM::BitcastOp::create(b, halfTy, bits);
  return LLVM::FPExtOp::create(b, f32, h);
}
Value GpuBuilder::sharedBytePtr(Value base, Value bytes) {
  return LLVM::GEPOp::create(b, ptrShared, b.getI8Type(), base,
                             ArrayRef<LLVM::GEPArg>{bytes});
}

Value GpuBuilder::swizzled(Value row, Value col, int64_t rowChunks) {
  Value chunk = xorI(divU(col, c32(8)), andI(row, c32(7)));
  return mul(add(mul(row, c32(rowChunks)), chunk), c32(16));
}

Value GpuBuilder::swizzledBlocked(Value row, Value col, int64_t blockBytes) {
  Value chunk = andI(xorI(divU(col, c32(8)), row), c32(7));
  return add(add(mul(divU(col, c32(64)), c32(blockBytes)), mul(row, c32(128))),
             mul(chunk, c32(16)));
}

void GpuBuilder::copyAsync(Value dst, Value src, Value srcBytes,
                           int64_t bytes) {
  switch (bytes) {
  case 16:
    intrinsic("llvm.nvvm.cp.async.cg.shared.global.16.s", {},
              {dst, src, srcBytes});
    return;
  case 8:
    intrinsic("llvm.nvvm.cp.async.ca.shared.global.8.s", {},
              {dst, src, srcBytes});
    return;
  case 4:
    intrinsic("llvm.nvvm.cp.async.ca.shared.global.4.s", {},
              {dst, src, srcBytes});
    return;
  default: {
    // 2-byte rows (odd head dims): a plain load, zero where out of range.
    Value inRange = cmp(arith::CmpIPredicate::sgt, srcBytes, c32(0));
    auto ifOp = scf::IfOp::create(b, TypeRange{i16}, inRange, true);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(ifOp.thenBlock());
      Value v = LLVM::LoadOp::create(b, i16, src);
      scf::YieldOp::create(b, v);
      b.setInsertionPointToStart(ifOp.elseBlock());
      Value zero = arith::ConstantOp::create(b, b.getI16IntegerAttr(0));
      scf::YieldOp::create(b, zero);
    }
    LLVM::StoreOp::create(b, ifOp.getResult(0), dst);
    return;
  }
  }
}

void GpuBuilder::warpSync() {
  intrinsic("llvm.nvvm.bar.warp.sync", {}, {c32(-1)});
}

void GpuBuilder::commitGroup() {
  intrinsic("llvm.nvvm.cp.async.commit.group", {}, {});
}
void GpuBuilder::waitAll() { intrinsic("llvm.nvvm.cp.async.wait.all", {}, {}); }
void GpuBuilder::waitGroup(int64_t pending) {
  intrinsic("llvm.nvvm.cp.async.wait.group", {}, {c32(pending)});
}

Frag4 GpuBuilder::ldmatrix4(Value addr, bool transpose) {
  auto structTy =
      LLVM::LLVMStructType::getLiteral(b.getContext(), {i32, i32, i32, i32});
  Value r =
      intrinsic(transpose ? "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.trans.b16"
                          : "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16",
                {structTy}, {addr});
  return {extract(r, 0), extract(r, 1), extract(r, 2), extract(r, 3)};
}

std::array<Value, 4> GpuBuilder::mma(const Frag4 &a, Value b0, Value b1,
                                     const std::array<Value, 4> &c) {
  auto structTy =
      LLVM::LLVMStructType::getLiteral(b.getContext(), {f32, f32, f32, f32});
  Value r;
  if (elem == Elem::BF16) {
    r = intrinsic("llvm.nvvm.mma.m16n8k16.row.col.bf16", {structTy},
                  {a[0], a[1], a[2], a[3], b0, b1, c[0], c[1], c[2], c[3]});
  } else {
    // The fp16 variant takes <2 x half> registers.
    auto v2 = VectorType::get({2}, b.getF16Type());
    auto cast = [&](Value x) { return LLVM::BitcastOp::create(b, v2, x); };
    r = intrinsic("llvm.nvvm.mma.m16n8k16.row.col.f32.f32", {structTy},
                  {cast(a[0]), cast(a[1]), cast(a[2]), cast(a[3]), cast(b0),
                   cast(b1), c[0], c[1], c[2], c[3]});
  }
  return {extract(r, 0), extract(r, 1), extract(r, 2), extract(r, 3)};
}

Value GpuBuilder::pairF32(Value x, Value y) {
  Value v = LLVM::PoisonOp::create(b, VectorType::get({2}, f32));
  v = LLVM::InsertElementOp::create(b, v, x, c32(0));
  return LLVM::InsertElementOp::create(b, v, y, c32(1));
}

Value GpuBuilder::pack2(Value x, Value y) {
  auto v2h = VectorType::get({2}, halfTy);
  Value h = LLVM::FPTruncOp::create(b, v2h, pairF32(x, y));
  return LLVM::BitcastOp::create(b, i32, h);
}

std::pair<Value, Value> GpuBuilder::unpack2(Value bits) {
  auto v2f = VectorType::get({2}, f32);
  auto v2h = VectorType::get({2}, halfTy);
  Value h = LLVM::BitcastOp::create(b, v2h, bits);
  Value v = LLVM::FPExtOp::create(b, v2f, h);
  return {LLVM::ExtractElementOp::create(b, v, c32(0)),
          LLVM::ExtractElementOp::create(b, v, c32(1))};
}

Value GpuBuilder::toElementBits(Value x) {
  Value h = LLVM::FPTruncOp::create(b, halfTy, x);
  return LLVM::BitcastOp::create(b, i16, h);
}

} // namespace flashjit::gpu
