//===- Wgmma.cpp - Hopper warpgroup MMAs (wgmma.mma_async) ----------------===//

#include "compiler/Conversion/Wgmma.h"

#include "mlir/Dialect/Utils/StaticValueUtils.h"

#include <string>
#include <tuple>

using namespace mlir;

namespace flashjit::gpu {

namespace {
/// Side-effecting inline asm returning \p results (a struct when several).
SmallVector<Value> asmValues(GpuBuilder &g, TypeRange results,
                             ValueRange operands, StringRef text,
                             StringRef constraints) {
  Type ty = results.size() == 1
                ? results[0]
                : LLVM::LLVMStructType::getLiteral(g.b.getContext(),
                                                   SmallVector<Type>(results));
  auto op = LLVM::InlineAsmOp::create(
      g.b, results.empty() ? TypeRange() : TypeRange(ty), operands, text,
      constraints, /*has_side_effects=*/true, /*is_align_stack=*/false,
      LLVM::tailcallkind::TailCallKind::None, LLVM::AsmDialectAttr(),
      ArrayAttr());
  SmallVector<Value> out;
  if (results.size() == 1)
    out.push_back(op.getResult(0));
  else
    for (size_t i = 0; i < results.size(); ++i)
      out.push_back(LLVM::ExtractValueOp::create(
          g.b, op.getResult(0), ArrayRef<int64_t>{int64_t(i)}));
  return out;
}

/// "$first, $first+1, ..., $first+n-1".
std::string operandList(int64_t first, int64_t n) {
  std::string s;
  for (int64_t i = 0; i < n; ++i)
    s += (i ? ", $" : "$") + std::to_string(first + i);
  return s;
}
} // namespace

Wgmma::Wgmma(GpuBuilder &g, Value smem) : g(g) {
  Value addr = LLVM::PtrToIntOp::create(g.b, g.i64, smem);
  descBase = g.andI(LLVM::TruncOp::create(
                        g.b, g.i32, arith::ShRUIOp::create(g.b, addr, g.c64(4))),
                    g.c32(0x3FFF));
}

/// \p v as a value plus a constant: the constant operands of a chain of
/// arith.addi peeled off (the offsets here are sums of byte offsets, each
/// at least 0, so that the value left is too).
static std::pair<Value, int64_t> splitConstant(Value v) {
  int64_t c = 0;
  while (auto add = v.getDefiningOp<arith::AddIOp>()) {
    if (std::optional<int64_t> k = getConstantIntValue(add.getRhs())) {
      c += *k;
      v = add.getLhs();
    } else if (std::optional<int64_t> k = getConstantIntValue(add.getLhs())) {
      c += *k;
      v = add.getRhs();
    } else {
      break;
    }
  }
  return {v, c};
}

Value Wgmma::descriptor(Value offset, Major major, int64_t blockBytes) {
  // K-major swizzled operands ignore the LBO (1 by convention); 8-row
  // groups are 1024 bytes apart in every blocked tile; 128B swizzle.
  const int64_t lbo = major == Major::MN ? blockBytes : 16, sbo = 1024;
  const int64_t high = (sbo >> 4) | (int64_t(1) << 30);
  auto [base, c] = splitConstant(offset);
  if (c < 0 || c % 16 != 0)
    std::tie(base, c) = std::make_pair(offset, int64_t(0));
  assert(batchBase && "descriptors are made after fence()");
  Value low = g.add(g.add(batchBase, arith::ShRUIOp::create(g.b, base,
                                                            g.c32(4))),
                    g.c32((c >> 4) + ((lbo >> 4) << 16)));
  return g.orI(arith::ExtUIOp::create(g.b, g.i64, low), g.c64(high << 32));
}

SmallVector<Value> Wgmma::mma(int64_t n, ArrayRef<Value> d, Value aDesc,
                              ArrayRef<Value> aRegs, Value bDesc, bool transA,
                              bool transB, bool accumulate) {
  const int64_t r = n / 2;
  assert(int64_t(d.size()) == r && "one f32 per thread and 2 columns");
  const char *ty = g.elem == Elem::BF16 ? "bf16" : "f16";
  SmallVector<Value> operands;
  std::string constraints;
  for (int64_t i = 0; i < r; ++i)
    constraints += "=f,";
  std::string aText;
  int64_t next = r;
  if (aDesc) {
    operands.push_back(aDesc);
    constraints += "l,";
    aText = "$" + std::to_string(next++);
  } else {
    for (Value a : aRegs)
      operands.push_back(a);
    constraints += "r,r,r,r,";
    aText = "{" + operandList(next, 4) + "}";
    next += 4;
  }
  operands.push_back(bDesc);
  constraints += "l,";
  int64_t bAt = next++;
  operands.push_back(g.c32(accumulate ? 1 : 0));
  constraints += "r";
  int64_t scaleAt = next++;
  for (int64_t i = 0; i < r; ++i) {
    operands.push_back(d[i]);
    constraints += "," + std::to_string(i);
  }
  std::string text =
      "{ .reg .pred p; setp.ne.b32 p, $" + std::to_string(scaleAt) +
      ", 0; wgmma.mma_async.sync.aligned.m64n" + std::to_string(n) +
      "k16.f32." + ty + "." + ty + " {" + operandList(0, r) + "}, " + aText +
      ", $" + std::to_string(bAt) + ", p, 1, 1, " +
      (aDesc ? std::string(transA ? "1, " : "0, ") : "") +
      (transB ? "1" : "0") + "; }";
  return asmValues(g, SmallVector<Type>(r, g.f32), operands, text, constraints);
}

SmallVector<Value> Wgmma::pin(ArrayRef<Value> values) {
  std::string constraints;
  SmallVector<Type> types;
  for (Value v : values) {
    types.push_back(v.getType());
    constraints += v.getType() == g.f32 ? "=f," : "=r,";
  }
  for (size_t i = 0; i < values.size(); ++i)
    constraints += (i ? "," : "") + std::to_string(i);
  return asmValues(g, types, values, "", constraints);
}

void Wgmma::fence() {
  asmValues(g, {}, {}, "wgmma.fence.sync.aligned;", "");
  batchBase = asmValues(g, {g.i32}, {descBase}, "mov.b32 $0, $1;", "=r,r")[0];
}
void Wgmma::commit() {
  asmValues(g, {}, {}, "wgmma.commit_group.sync.aligned;", "");
}
void Wgmma::wait(int64_t pending) {
  asmValues(g, {}, {},
            "wgmma.wait_group.sync.aligned " + std::to_string(pending) + ";",
            "");
}
void Wgmma::fenceProxyAsync() {
  asmValues(g, {}, {}, "fence.proxy.async.shared::cta;", "");
}

} // namespace flashjit::gpu
