//===- PTXEmitterTests.cpp - gpu.module (LLVM + NVVM) -> PTX -> cubin -----===//
//
/// \file
/// Tests of compiler/Target/PTXEmitter: NVVM intrinsics reached through
/// llvm.call_intrinsic translate and select for sm_80 and sm_90a, the PTX
/// header follows PtxOptions, nvJitLink assembles the result (skipped without
/// the library), and target/IR errors come back as CompileError instead of
/// ending the process.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "compiler/Target/PTXEmitter.h"
#include "runtime/NvJitLink.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <string>

using namespace flashjit;

namespace {

constexpr const char *kVadd = R"mlir(
module {
  gpu.module @k {
    llvm.func @vadd(%a: !llvm.ptr<1>, %b: !llvm.ptr<1>) attributes {nvvm.kernel} {
      %tid = nvvm.read.ptx.sreg.tid.x : i32
      %pa = llvm.getelementptr %a[%tid] : (!llvm.ptr<1>, i32) -> !llvm.ptr<1>, f32
      %pb = llvm.getelementptr %b[%tid] : (!llvm.ptr<1>, i32) -> !llvm.ptr<1>, f32
      %x = llvm.load %pa : !llvm.ptr<1> -> f32
      %y = llvm.load %pb : !llvm.ptr<1> -> f32
      %s = llvm.fadd %x, %y : f32
      llvm.store %s, %pa : f32, !llvm.ptr<1>
      llvm.return
    }
  }
}
)mlir";

/// Every NVVM intrinsic the attention kernels call through
/// llvm.call_intrinsic, with the spelling the lowering uses.
constexpr const char *kIntrinsics = R"mlir(
module {
  gpu.module @k {
    llvm.func @intrinsics(%a: !llvm.ptr<1>, %b: !llvm.ptr<1>) attributes {nvvm.kernel} {
      %smem = llvm.mlir.addressof @tile : !llvm.ptr<3>
      %tid = nvvm.read.ptx.sreg.tid.x : i32
      %p = llvm.getelementptr %a[%tid] : (!llvm.ptr<1>, i32) -> !llvm.ptr<1>, f32
      %x = llvm.load %p : !llvm.ptr<1> -> f32
      %e = llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f32"(%x) : (f32) -> f32
      %l = llvm.call_intrinsic "llvm.nvvm.lg2.approx.f"(%e) : (f32) -> f32
      %all = llvm.mlir.constant(-1 : i32) : i32
      %one = llvm.mlir.constant(1 : i32) : i32
      %clamp = llvm.mlir.constant(31 : i32) : i32
      %sh = llvm.call_intrinsic "llvm.nvvm.shfl.sync.bfly.f32"(%all, %l, %one, %clamp) : (i32, f32, i32, i32) -> f32
      llvm.store %sh, %p : f32, !llvm.ptr<1>
      %sp = llvm.getelementptr %smem[%tid] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, vector<4xi32>
      %gp = llvm.getelementptr %b[%tid] : (!llvm.ptr<1>, i32) -> !llvm.ptr<1>, vector<4xi32>
      %sixteen = llvm.mlir.constant(16 : i32) : i32
      %four = llvm.mlir.constant(4 : i32) : i32
      llvm.call_intrinsic "llvm.nvvm.cp.async.cg.shared.global.16.s"(%sp, %gp, %sixteen) : (!llvm.ptr<3>, !llvm.ptr<1>, i32) -> ()
      llvm.call_intrinsic "llvm.nvvm.cp.async.ca.shared.global.4.s"(%sp, %b, %four) : (!llvm.ptr<3>, !llvm.ptr<1>, i32) -> ()
      llvm.call_intrinsic "llvm.nvvm.cp.async.commit.group"() : () -> ()
      %zero = llvm.mlir.constant(0 : i32) : i32
      llvm.call_intrinsic "llvm.nvvm.cp.async.wait.group"(%zero) : (i32) -> ()
      %fr = llvm.call_intrinsic "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16"(%sp) : (!llvm.ptr<3>) -> !llvm.struct<(i32, i32, i32, i32)>
      %a0 = llvm.extractvalue %fr[0] : !llvm.struct<(i32, i32, i32, i32)>
      %a1 = llvm.extractvalue %fr[1] : !llvm.struct<(i32, i32, i32, i32)>
      %a2 = llvm.extractvalue %fr[2] : !llvm.struct<(i32, i32, i32, i32)>
      %a3 = llvm.extractvalue %fr[3] : !llvm.struct<(i32, i32, i32, i32)>
      %d = llvm.call_intrinsic "llvm.nvvm.mma.m16n8k16.row.col.bf16"(%a0, %a1, %a2, %a3, %a2, %a3, %x, %e, %l, %sh) : (i32, i32, i32, i32, i32, i32, f32, f32, f32, f32) -> !llvm.struct<(f32, f32, f32, f32)>
      %d0 = llvm.extractvalue %d[0] : !llvm.struct<(f32, f32, f32, f32)>
      %d3 = llvm.extractvalue %d[3] : !llvm.struct<(f32, f32, f32, f32)>
      %q = llvm.getelementptr %p[%one] : (!llvm.ptr<1>, i32) -> !llvm.ptr<1>, f32
      llvm.store %d0, %q : f32, !llvm.ptr<1>
      llvm.store %d3, %p : f32, !llvm.ptr<1>
      llvm.return
    }
    llvm.mlir.global internal @tile() {addr_space = 3 : i32, alignment = 16 : i64} : !llvm.array<512 x i32>
  }
}
)mlir";

class PtxEmitterTest : public ::testing::Test {
protected:
  PtxEmitterTest() {
    // Dialects only: gpuModuleToPtx registers the translations it needs.
    mlir::DialectRegistry registry;
    registry.insert<mlir::LLVM::LLVMDialect, mlir::NVVM::NVVMDialect,
                    mlir::gpu::GPUDialect>();
    ctx = std::make_unique<mlir::MLIRContext>(
        registry, mlir::MLIRContext::Threading::DISABLED);
    ctx->loadAllAvailableDialects();
  }

  mlir::OwningOpRef<mlir::ModuleOp> parse(const std::string &text) {
    auto module = mlir::parseSourceString<mlir::ModuleOp>(text, ctx.get());
    EXPECT_TRUE(module) << "cannot parse:\n" << text;
    return module;
  }

  /// kIntrinsics with the first occurrence of \p from replaced by \p to.
  static std::string intrinsicsWith(const std::string &from,
                                    const std::string &to) {
    std::string text = kIntrinsics;
    size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  }

  std::unique_ptr<mlir::MLIRContext> ctx;
};

bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

TEST_F(PtxEmitterTest, VaddHeaderFollowsOptions) {
  auto module = parse(kVadd);
  ASSERT_TRUE(module);
  std::string ptx = gpuModuleToPtx(*module, PtxOptions{});
  EXPECT_TRUE(contains(ptx, ".version 8.0")) << ptx;
  EXPECT_TRUE(contains(ptx, ".target sm_90a")) << ptx;
  EXPECT_TRUE(contains(ptx, ".entry vadd")) << ptx;
  EXPECT_TRUE(contains(ptx, "%tid.x")) << ptx;

  std::string ptx80 = gpuModuleToPtx(*module, PtxOptions{"sm_80", 90, 3});
  EXPECT_TRUE(contains(ptx80, ".version 9.0")) << ptx80;
  EXPECT_TRUE(contains(ptx80, ".target sm_80")) << ptx80;
}

TEST_F(PtxEmitterTest, LlvmIrIsForNvptx) {
  auto module = parse(kVadd);
  ASSERT_TRUE(module);
  std::string ir = gpuModuleToLLVMIR(*module, PtxOptions{});
  EXPECT_TRUE(contains(ir, "target triple = \"nvptx64-nvidia-cuda\"")) << ir;
  EXPECT_TRUE(contains(ir, "target datalayout = \"e-")) << ir;
  EXPECT_TRUE(contains(ir, "!\"nvvm-reflect-ftz\", i32 1")) << ir;
  EXPECT_TRUE(contains(ir, "define ptx_kernel void @vadd")) << ir;
}

TEST_F(PtxEmitterTest, NvvmReflectSeesFtz) {
  // The O3 pipeline runs NVVMReflect (libdevice's way of asking for FTZ),
  // and the gpu.module may carry an #nvvm.target.
  auto module = parse(R"mlir(
module {
  gpu.module @k [#nvvm.target<chip = "sm_90a">] {
    llvm.mlir.global private constant @ftz("__CUDA_FTZ\00") {addr_space = 0 : i32} : !llvm.array<11 x i8>
    llvm.func @__nvvm_reflect(!llvm.ptr) -> i32
    llvm.func @reflect(%out: !llvm.ptr<1>) attributes {nvvm.kernel} {
      %name = llvm.mlir.addressof @ftz : !llvm.ptr
      %r = llvm.call @__nvvm_reflect(%name) : (!llvm.ptr) -> i32
      llvm.store %r, %out : i32, !llvm.ptr<1>
      llvm.return
    }
  }
}
)mlir");
  ASSERT_TRUE(module);
  std::string ir = gpuModuleToLLVMIR(*module, PtxOptions{});
  EXPECT_TRUE(contains(ir, "store i32 1, ptr addrspace(1)")) << ir;
  EXPECT_FALSE(contains(ir, "call i32 @__nvvm_reflect")) << ir;
}

TEST_F(PtxEmitterTest, IntrinsicsSelectAndAssemble) {
  auto module = parse(kIntrinsics);
  ASSERT_TRUE(module);
  rt::NvJitLink &nvJitLink = rt::NvJitLink::get();
  for (const char *arch : {"sm_80", "sm_90a"}) {
    SCOPED_TRACE(arch);
    std::string ptx = gpuModuleToPtx(*module, PtxOptions{arch, 80, 3});
    EXPECT_TRUE(contains(ptx, std::string(".target ") + arch)) << ptx;
    EXPECT_TRUE(contains(ptx, ".version 8.0")) << ptx;
    for (const char *instr :
         {"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
          "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
          "cp.async.cg.shared.global", "cp.async.ca.shared.global",
          "cp.async.commit_group", "cp.async.wait_group", "ex2.approx.ftz.f32",
          "lg2.approx.f32", "shfl.sync.bfly.b32"})
      EXPECT_TRUE(contains(ptx, instr)) << instr << " missing in\n" << ptx;
    if (!nvJitLink.available())
      continue;
    rt::CubinResult cubin = rt::ptxToCubin(ptx, arch);
    ASSERT_GE(cubin.cubin.size(), 4u);
    EXPECT_EQ(std::string(cubin.cubin.data(), 4), "\x7f"
                                                  "ELF");
    EXPECT_TRUE(contains(cubin.infoLog, "intrinsics")) << cubin.infoLog;
  }
  if (!nvJitLink.available())
    GTEST_SKIP() << nvJitLink.unavailableReason();
}

TEST_F(PtxEmitterTest, OverloadedSpellings) {
  // Overloaded intrinsics take their suffix from the operand types; a
  // spelled-out suffix is accepted too.
  for (auto [from, to, instr] :
       {std::tuple<std::string, std::string, std::string>{
            "llvm.nvvm.ex2.approx.ftz.f32", "llvm.nvvm.ex2.approx.ftz",
            "ex2.approx.ftz.f32"},
        {"llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16",
         "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16.p3",
         "ldmatrix.sync.aligned.m8n8.x4.shared.b16"}}) {
    auto module = parse(intrinsicsWith(from, to));
    ASSERT_TRUE(module);
    std::string ptx = gpuModuleToPtx(*module, PtxOptions{"sm_80", 80, 3});
    EXPECT_TRUE(contains(ptx, instr)) << to;
  }
}

TEST(PtxVersion, Choose) {
  EXPECT_EQ(maxPtxVersion(), 90);
  EXPECT_EQ(minPtxVersion("sm_80"), 70);
  EXPECT_EQ(minPtxVersion("sm_90"), 78);
  EXPECT_EQ(minPtxVersion("sm_90a"), 80);
  EXPECT_EQ(choosePtxVersion("sm_80", 0), 70);
  EXPECT_EQ(choosePtxVersion("sm_90a", 0), 80);
  EXPECT_EQ(choosePtxVersion("sm_90a", 13000), 90);
  EXPECT_EQ(choosePtxVersion("sm_90a", 13010), 90); // capped by LLVM
  EXPECT_EQ(choosePtxVersion("sm_90a", 12080), 87);
  EXPECT_EQ(choosePtxVersion("sm_90a", 12040), 84);
  EXPECT_EQ(choosePtxVersion("sm_90a", 12000), 80);
  EXPECT_EQ(choosePtxVersion("sm_80", 12000), 80);
  EXPECT_EQ(choosePtxVersion("sm_90", 11080), 78);
  EXPECT_EQ(choosePtxVersion("sm_90a", 11080), 80); // the minimum wins
  EXPECT_THROW(choosePtxVersion("sm_99", 0), CompileError);
}

TEST(PtxTarget, Check) {
  EXPECT_NO_THROW(checkTarget(PtxOptions{"sm_80", 80, 3}));
  EXPECT_NO_THROW(checkTarget(PtxOptions{"sm_90a", 90, 0}));
  EXPECT_THROW(checkTarget(PtxOptions{"sm_99", 80, 3}), CompileError);
  EXPECT_THROW(checkTarget(PtxOptions{"compute_90", 80, 3}), CompileError);
  EXPECT_THROW(checkTarget(PtxOptions{"sm_90a", 91, 3}), CompileError);
  EXPECT_THROW(checkTarget(PtxOptions{"sm_90a", 78, 3}), CompileError);
  EXPECT_THROW(checkTarget(PtxOptions{"sm_80", 60, 3}), CompileError);
  EXPECT_THROW(checkTarget(PtxOptions{"sm_80", 80, 4}), CompileError);
  try {
    checkTarget(PtxOptions{"sm_90a", 78, 3});
  } catch (const CompileError &e) {
    EXPECT_TRUE(contains(e.what(), "8.0")) << e.what();
  }
}

TEST_F(PtxEmitterTest, IntrinsicTooNewForArchIsAnError) {
  // NVPTX would end the process with "Cannot select" for mma on sm_75.
  auto module = parse(kIntrinsics);
  ASSERT_TRUE(module);
  try {
    gpuModuleToPtx(*module, PtxOptions{"sm_75", 80, 3});
    FAIL() << "expected CompileError";
  } catch (const CompileError &e) {
    EXPECT_TRUE(contains(e.what(), "needs sm_80")) << e.what();
  }
}

TEST_F(PtxEmitterTest, NonConstantImmargIsAnError) {
  auto module =
      parse(intrinsicsWith("\"llvm.nvvm.cp.async.wait.group\"(%zero)",
                           "\"llvm.nvvm.cp.async.wait.group\"(%tid)"));
  ASSERT_TRUE(module);
  try {
    gpuModuleToPtx(*module, PtxOptions{"sm_80", 80, 3});
    FAIL() << "expected CompileError";
  } catch (const CompileError &e) {
    EXPECT_TRUE(contains(e.what(), "immarg")) << e.what();
  }
}

TEST_F(PtxEmitterTest, UnknownIntrinsicIsAnError) {
  auto module = parse(
      intrinsicsWith("llvm.nvvm.lg2.approx.f", "llvm.nvvm.lg2.approx.nope"));
  ASSERT_TRUE(module);
  try {
    gpuModuleToPtx(*module, PtxOptions{"sm_80", 80, 3});
    FAIL() << "expected CompileError";
  } catch (const CompileError &e) {
    EXPECT_TRUE(contains(e.what(), "lg2.approx.nope")) << e.what();
  }
}

TEST_F(PtxEmitterTest, NeedsExactlyOneGpuModule) {
  auto module = parse("module {}");
  ASSERT_TRUE(module);
  EXPECT_THROW(gpuModuleToPtx(*module, PtxOptions{}), CompileError);
}

} // namespace
