//===- BackwardTileIrTests.cpp - The tiled backward is tile IR ------------===//
//
/// \file
/// The backward's tiled functions are the shared stage's tile IR, as the
/// forward's: every op is a tile op, scf control flow carrying tiles,
/// elementwise arith / math on tiles, or scalar index arithmetic (and the
/// scalar loads of a BCSR layout's i32 lists): no buffers of their own
/// (memref.alloca), no scalar stores, no scalar atomics, no f32 scalar
/// arithmetic, no loop that carries no tile. Checked over both dQ modes,
/// masks, GQA and block-sparse layouts, with the checker shown to reject the
/// old scalar-loop form. (That both dQ modes of this IR match the float64
/// gradients on the CPU is CpuBackwardTests' matrix, every case in both.)
//
//===----------------------------------------------------------------------===//

#include "compiler/CompilerInternal.h"
#include "dialects/Attn/IR/AttnDialect.h"
#include "dialects/Tile/IR/TileDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

using namespace flashjit;

namespace {

bool isTensor(mlir::Type t) { return mlir::isa<mlir::TensorType>(t); }

/// What in \p fn is not tile IR (empty: all of it is), one line per op.
std::vector<std::string> nonTileOps(mlir::func::FuncOp fn) {
  std::vector<std::string> bad;
  fn.walk<mlir::WalkOrder::PreOrder>([&](mlir::Operation *op) {
    if (op == fn.getOperation())
      return;
    mlir::Dialect *d = op->getDialect();
    llvm::StringRef ns = d ? d->getNamespace() : "";
    bool onTiles = llvm::any_of(op->getResultTypes(), isTensor) ||
                   llvm::any_of(op->getOperandTypes(), isTensor);
    bool ok = false;
    if (ns == "tile" || mlir::isa<mlir::func::ReturnOp>(op)) {
      ok = true;
    } else if (auto f = mlir::dyn_cast<mlir::scf::ForOp>(op)) {
      ok = llvm::any_of(f.getInitArgs().getTypes(), isTensor);
    } else if (ns == "scf") {
      ok = mlir::isa<mlir::scf::IfOp, mlir::scf::YieldOp>(op);
    } else if (ns == "arith" || ns == "math") {
      // On tiles, or scalar index / integer arithmetic (no f32 scalars,
      // except the kernel's scale arguments entering a tile by splat).
      ok = onTiles || llvm::none_of(op->getResultTypes(), [](mlir::Type t) {
             return mlir::isa<mlir::FloatType>(t);
           });
    } else if (auto load = mlir::dyn_cast<mlir::memref::LoadOp>(op)) {
      ok = load.getMemRefType().getElementType().isInteger(32);
    }
    if (!ok)
      bad.push_back(op->getName().getStringRef().str());
  });
  return bad;
}

/// The tiled functions of \p spec, by role, each with its non-tile ops.
struct TiledBackward {
  std::map<std::string, std::vector<std::string>> problems;
  std::map<std::string, int> dots, atomicAdds;
};

TiledBackward tile(const AttentionSpec &spec, const TileConfig &config) {
  auto ctx = createContext();
  auto module = loadSource(*ctx, spec, KernelSource{}, config, nullptr);
  TiledBackward r;
  module->walk([&](mlir::func::FuncOp fn) {
    auto kernel = fn->getAttrOfType<attn::KernelAttr>("attn.kernel");
    EXPECT_TRUE(kernel) << fn.getName().str();
    if (!kernel)
      return;
    std::string role = kernel.getRole().str();
    r.problems[role] = nonTileOps(fn);
    fn.walk([&](tile::DotOp) { ++r.dots[role]; });
    fn.walk([&](tile::AtomicAddOp) { ++r.atomicAdds[role]; });
  });
  return r;
}

struct Variant {
  const char *name;
  MaskKind mask;
  int64_t gqa, sparseBlock;
};

TEST(BackwardTileIr, EveryFunctionIsTileIr) {
  const Variant variants[] = {{"dense", MaskKind::None, 1, 0},
                              {"causal_gqa2", MaskKind::Causal, 2, 0},
                              {"window", MaskKind::SlidingWindow, 1, 0},
                              {"sparse_causal", MaskKind::Causal, 1, 128}};
  for (const Variant &v : variants)
    for (bool deterministic : {false, true}) {
      SCOPED_TRACE(std::string(v.name) +
                   (deterministic ? " deterministic" : " atomic"));
      AttentionSpec spec;
      spec.direction = Direction::Backward;
      spec.headDimQK = 48;
      spec.headDimV = 32;
      spec.mask = v.mask;
      spec.gqaGroup = v.gqa;
      spec.blockSparse = v.sparseBlock > 0;
      if (spec.blockSparse)
        spec.sparseBlock = v.sparseBlock;
      spec.deterministic = deterministic;
      TileConfig config;
      config.blockM = 32;
      config.blockN = 64;
      TiledBackward t = tile(spec, config);
      const char *dqRole = deterministic ? "dq" : "dq_convert";
      ASSERT_EQ(t.problems.size(), 3u);
      for (const char *role : {"preprocess", "main", dqRole}) {
        ASSERT_TRUE(t.problems.count(role)) << role;
        std::string list;
        for (const std::string &op : t.problems[role])
          list += " " + op;
        EXPECT_TRUE(t.problems[role].empty()) << role << ":" << list;
      }
      // S^T, dV, dP^T, dK (and dQ's share with atomic dQ); the dQ pass:
      // S, dP, dQ; the row kernels multiply no matrices.
      EXPECT_EQ(t.dots["main"], deterministic ? 4 : 5);
      EXPECT_EQ(t.dots[dqRole], deterministic ? 3 : 0);
      EXPECT_EQ(t.dots["preprocess"], 0);
      EXPECT_EQ(t.atomicAdds["main"], deterministic ? 0 : 1);
      EXPECT_EQ(t.atomicAdds[dqRole], 0);
    }
}

/// The checker rejects the old form: scalar loops over buffers of the
/// function's own, f32 scalar arithmetic, scalar stores and atomics.
TEST(BackwardTileIr, CheckerRejectsScalarLoops) {
  const char *old = R"mlir(
    func.func @f(%acc: memref<?xf32>, %x: memref<?xbf16>, %n: index) {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %t = memref.alloca() : memref<16xf32>
      scf.for %i = %c0 to %n step %c1 {
        %v = memref.load %x[%i] : memref<?xbf16>
        %w = arith.extf %v : bf16 to f32
        memref.store %w, %t[%c0] : memref<16xf32>
        %r = memref.atomic_rmw addf %w, %acc[%i] : (f32, memref<?xf32>) -> f32
      }
      return
    })mlir";
  auto ctx = createContext();
  auto module = mlir::parseSourceString<mlir::ModuleOp>(old, ctx.get());
  ASSERT_TRUE(module);
  auto fn = *module->getOps<mlir::func::FuncOp>().begin();
  std::vector<std::string> bad = nonTileOps(fn);
  std::vector<std::string> expected = {"memref.alloca", "scf.for",
                                       "memref.load",   "arith.extf",
                                       "memref.store",  "memref.atomic_rmw"};
  EXPECT_EQ(bad, expected);
}

} // namespace
