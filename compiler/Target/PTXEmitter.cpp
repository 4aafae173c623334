//===- PTXEmitter.cpp - gpu.module (LLVM + NVVM dialects) -> PTX ----------===//

#include "compiler/Target/PTXEmitter.h"

#include "compiler/Compiler.h"
#include "compiler/CompilerInternal.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/NVVM/NVVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Export.h"
#include "mlir/Target/LLVMIR/LLVMTranslationInterface.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/IR/InlineAsm.h"
#include "llvm/IR/DiagnosticInfo.h"
#include "llvm/IR/DiagnosticPrinter.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Verifier.h"
#include "llvm/MC/MCSubtargetInfo.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Target/TargetOptions.h"
#include "llvm/TargetParser/Triple.h"

#include <map>
#include <memory>
#include <mutex>

using namespace mlir;

namespace flashjit {
namespace {

constexpr const char *kTriple = "nvptx64-nvidia-cuda";

/// The NVPTX target, initialised once per process.
const llvm::Target &nvptxTarget() {
  static const llvm::Target *target = [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
    std::string error;
    const llvm::Target *t =
        llvm::TargetRegistry::lookupTarget(llvm::Triple(kTriple), error);
    if (!t)
      throw CompileError("NVPTX target unavailable: " + error);
    return t;
  }();
  return *target;
}

/// What LLVM's NVPTX backend knows: processors and PTX ISA versions, read
/// from its subtarget tables once.
struct NvptxTables {
  std::vector<std::string> archs;
  std::vector<int> ptxVersions; ///< Ascending, times ten.
};

const NvptxTables &nvptxTables() {
  static const NvptxTables tables = [] {
    NvptxTables t;
    std::unique_ptr<llvm::MCSubtargetInfo> sti(
        nvptxTarget().createMCSubtargetInfo(llvm::Triple(kTriple), "", ""));
    for (const llvm::SubtargetSubTypeKV &proc :
         sti->getAllProcessorDescriptions())
      t.archs.push_back(proc.Key);
    for (const llvm::SubtargetFeatureKV &feature :
         sti->getAllProcessorFeatures()) {
      llvm::StringRef key(feature.Key);
      int version = 0;
      if (key.consume_front("ptx") && !key.getAsInteger(10, version))
        t.ptxVersions.push_back(version);
    }
    llvm::sort(t.ptxVersions);
    return t;
  }();
  return tables;
}

std::unique_ptr<llvm::TargetMachine>
createTargetMachine(const std::string &arch, const std::string &features,
                    int optLevel) {
  static const llvm::CodeGenOptLevel levels[] = {
      llvm::CodeGenOptLevel::None, llvm::CodeGenOptLevel::Less,
      llvm::CodeGenOptLevel::Default, llvm::CodeGenOptLevel::Aggressive};
  std::unique_ptr<llvm::TargetMachine> tm(nvptxTarget().createTargetMachine(
      llvm::Triple(kTriple), arch, features, llvm::TargetOptions(),
      std::nullopt, std::nullopt, levels[optLevel]));
  if (!tm)
    throw CompileError("cannot create the NVPTX target machine for " + arch);
  return tm;
}

/// Collects LLVM diagnostics of error severity (which, without a handler,
/// would end the process) and prints nothing.
struct LlvmDiagnostics {
  std::string errors;

  explicit LlvmDiagnostics(llvm::LLVMContext &ctx) {
    ctx.setDiagnosticHandlerCallBack(
        [](const llvm::DiagnosticInfo *info, void *self) {
          if (info->getSeverity() != llvm::DS_Error)
            return;
          std::string &errors = static_cast<LlvmDiagnostics *>(self)->errors;
          llvm::raw_string_ostream os(errors);
          if (!errors.empty())
            os << "\n";
          llvm::DiagnosticPrinterRawOStream printer(os);
          info->print(printer);
        },
        this);
  }
  void throwIfAny(const char *stage) const {
    if (!errors.empty())
      throw CompileError(std::string(stage) + ": " + errors);
  }
};

/// Emits PTX for \p module with \p tm.
std::string emitPtx(llvm::Module &module, llvm::TargetMachine &tm) {
  llvm::SmallString<0> ptx;
  llvm::raw_svector_ostream os(ptx);
  llvm::legacy::PassManager pm;
  if (tm.addPassesToEmitFile(pm, os, nullptr,
                             llvm::CodeGenFileType::AssemblyFile))
    throw CompileError("the NVPTX target machine cannot emit PTX");
  pm.run(module);
  return std::string(ptx.str());
}

/// Parses the "sm_90a" form: 90 and "a".
std::pair<int, llvm::StringRef> parseArch(llvm::StringRef arch) {
  int sm = 0;
  llvm::StringRef rest = arch;
  rest.consume_front("sm_");
  size_t digits = rest.find_first_not_of("0123456789");
  llvm::StringRef number = rest.take_front(digits);
  if (number.getAsInteger(10, sm))
    sm = 0;
  return {sm, rest.drop_front(number.size())};
}

/// NVVM intrinsics that the NVPTX instruction selector cannot select below an
/// architecture ("Cannot select: intrinsic", which ends the process). First
/// matching prefix wins.
struct IntrinsicRequirement {
  const char *prefix;
  int minSm;
  /// Needs the architecture-specific target of exactly minSm ("sm_90a").
  bool archSpecific;
};
constexpr IntrinsicRequirement kIntrinsicRequirements[] = {
    {"llvm.nvvm.wgmma.", 90, true},
    {"llvm.nvvm.cp.async.bulk.", 90, false},
    {"llvm.nvvm.stmatrix.", 90, false},
    {"llvm.nvvm.mma.m16n8k8.row.col.bf16", 80, false},
    {"llvm.nvvm.mma.m16n8k8.row.col.tf32", 80, false},
    {"llvm.nvvm.mma.m16n8k8.", 75, false},
    {"llvm.nvvm.mma.m16n8k16.", 80, false},
    {"llvm.nvvm.mma.m16n8k32.", 80, false},
    {"llvm.nvvm.ldmatrix.", 75, false},
    {"llvm.nvvm.cp.async.", 80, false},
    {"llvm.nvvm.redux.sync.", 80, false},
};

/// Throws CompileError if \p module calls an intrinsic that \p arch lacks.
void checkIntrinsics(const llvm::Module &module, const std::string &arch) {
  auto [sm, suffix] = parseArch(arch);
  for (const llvm::Function &fn : module) {
    if (!fn.isIntrinsic() || fn.use_empty())
      continue;
    llvm::StringRef name = fn.getName();
    for (const IntrinsicRequirement &req : kIntrinsicRequirements) {
      if (!name.starts_with(req.prefix))
        continue;
      bool ok =
          req.archSpecific ? sm == req.minSm && suffix == "a" : sm >= req.minSm;
      if (!ok)
        throw CompileError((name + " needs sm_" + llvm::Twine(req.minSm) +
                            (req.archSpecific ? "a" : "") +
                            " (target: " + arch + ")")
                               .str());
      break;
    }
  }
}

/// Instructions flashjit's lowerings write as inline PTX, which no
/// instruction selector checks: the architecture and PTX ISA each needs
/// (a module lowered for another target, e.g. flashjit-opt with wgmma=true
/// and chip=sm_80, is a named error, not PTX that ptxas rejects).
struct AsmRequirement {
  const char *text;
  int minSm;
  bool archSpecific; ///< exactly sm_<minSm>a
  int minPtx;        ///< PTX ISA version times ten
};
constexpr AsmRequirement kAsmRequirements[] = {
    {"wgmma.", 90, true, 80},
    {"fence.proxy.async", 90, false, 80},
    {"red.global.add.v2.f32", 90, false, 81},
};

/// Throws CompileError if \p module's inline PTX needs more than \p opts.
void checkInlineAsm(const llvm::Module &module, const PtxOptions &opts) {
  auto [sm, suffix] = parseArch(opts.arch);
  for (const llvm::Function &fn : module)
    for (const llvm::BasicBlock &block : fn)
      for (const llvm::Instruction &inst : block) {
        auto *call = llvm::dyn_cast<llvm::CallBase>(&inst);
        auto *asmOp =
            call ? llvm::dyn_cast<llvm::InlineAsm>(call->getCalledOperand())
                 : nullptr;
        if (!asmOp)
          continue;
        llvm::StringRef text = asmOp->getAsmString();
        for (const AsmRequirement &req : kAsmRequirements) {
          if (!text.contains(req.text))
            continue;
          bool ok = (req.archSpecific ? sm == req.minSm && suffix == "a"
                                      : sm >= req.minSm) &&
                    opts.ptxVersion >= req.minPtx;
          if (!ok)
            throw CompileError(
                (llvm::Twine("the kernel uses ") + req.text + " (inline PTX), "
                 "which needs sm_" + llvm::Twine(req.minSm) +
                 (req.archSpecific ? "a" : "") + " and PTX ISA " +
                 llvm::Twine(req.minPtx / 10) + "." +
                 llvm::Twine(req.minPtx % 10) + " (target: " + opts.arch +
                 ", PTX ISA " + llvm::Twine(opts.ptxVersion / 10) + "." +
                 llvm::Twine(opts.ptxVersion % 10) +
                 "): lower it for that target")
                    .str());
        }
      }
}

/// Registers the LLVM IR translation of each dialect the GPU path uses on
/// \p ctx unless the context's registry already provided it.
void ensureTranslations(MLIRContext &ctx) {
  auto missing = [&](llvm::StringRef name) {
    Dialect *dialect = ctx.getLoadedDialect(name);
    return dialect &&
           !dialect->getRegisteredInterface<LLVMTranslationDialectInterface>();
  };
  if (missing("builtin"))
    registerBuiltinDialectTranslation(ctx);
  if (missing("llvm"))
    registerLLVMDialectTranslation(ctx);
  if (missing("nvvm"))
    registerNVVMDialectTranslation(ctx);
  if (missing("gpu"))
    registerGPUDialectTranslation(ctx);
}

/// The only gpu.module directly inside \p module.
gpu::GPUModuleOp findGpuModule(ModuleOp module) {
  auto gpuModules = module.getBody()->getOps<gpu::GPUModuleOp>();
  auto count = std::distance(gpuModules.begin(), gpuModules.end());
  if (count != 1)
    throw CompileError("expected exactly one gpu.module in the module, found " +
                       std::to_string(count));
  return *gpuModules.begin();
}

/// The LLVM IR of \p module's gpu.module, optimised; owns its context.
struct OptimizedModule {
  std::unique_ptr<llvm::LLVMContext> context;
  std::unique_ptr<LlvmDiagnostics> diagnostics;
  std::unique_ptr<llvm::TargetMachine> targetMachine;
  std::unique_ptr<llvm::Module> module;
};

OptimizedModule translateAndOptimize(gpu::GPUModuleOp gpuModule,
                                     const PtxOptions &opts) {
  checkTarget(opts);
  MLIRContext &ctx = *gpuModule.getContext();
  ensureTranslations(ctx);

  OptimizedModule result;
  result.context = std::make_unique<llvm::LLVMContext>();
  result.diagnostics = std::make_unique<LlvmDiagnostics>(*result.context);
  {
    DiagnosticCollector mlirErrors(ctx);
    // Verified below, where the verifier's messages can be kept (the
    // translation's own check prints them to stderr).
    result.module = translateModuleToLLVMIR(
        gpuModule.getOperation(), *result.context, gpuModule.getName(),
        /*disableVerification=*/true);
    if (!result.module)
      throw CompileError("translating the gpu.module to LLVM IR failed: " +
                         mlirErrors.str());
  }
  llvm::Module &llvmModule = *result.module;

  result.targetMachine = createTargetMachine(
      opts.arch, "+ptx" + std::to_string(opts.ptxVersion), opts.optLevel);
  llvm::TargetMachine &tm = *result.targetMachine;
  llvmModule.setTargetTriple(llvm::Triple(kTriple));
  llvmModule.setDataLayout(tm.createDataLayout());
  llvmModule.addModuleFlag(llvm::Module::Override, "nvvm-reflect-ftz", 1);

  std::string verifierErrors;
  llvm::raw_string_ostream verifierOs(verifierErrors);
  if (llvm::verifyModule(llvmModule, &verifierOs))
    throw CompileError("invalid LLVM IR from the gpu.module: " +
                       verifierErrors);
  checkIntrinsics(llvmModule, opts.arch);
  checkInlineAsm(llvmModule, opts);

  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  // The PassBuilder registers the TargetMachine's callbacks (NVVMReflect,
  // NVPTX address-space inference, ...) and its TargetIRAnalysis.
  llvm::PassBuilder pb(&tm);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  static const llvm::OptimizationLevel levels[] = {
      llvm::OptimizationLevel::O0, llvm::OptimizationLevel::O1,
      llvm::OptimizationLevel::O2, llvm::OptimizationLevel::O3};
  llvm::ModulePassManager mpm =
      opts.optLevel == 0
          ? pb.buildO0DefaultPipeline(llvm::OptimizationLevel::O0)
          : pb.buildPerModuleDefaultPipeline(levels[opts.optLevel]);
  mpm.run(llvmModule, mam);
  result.diagnostics->throwIfAny("LLVM optimisation failed");
  return result;
}

/// \p module's only gpu.module, once \p opts is known to be valid (the
/// target is checked first).
gpu::GPUModuleOp checkedGpuModule(ModuleOp module, const PtxOptions &opts) {
  checkTarget(opts);
  return findGpuModule(module);
}

} // namespace

int maxPtxVersion() {
  const std::vector<int> &versions = nvptxTables().ptxVersions;
  return versions.empty() ? 0 : versions.back();
}

int minPtxVersion(const std::string &arch) {
  if (!llvm::is_contained(nvptxTables().archs, arch))
    throw CompileError("unknown GPU architecture '" + arch +
                       "' (LLVM's NVPTX backend knows " +
                       llvm::join(nvptxTables().archs, ", ") + ")");
  // LLVM keeps the table in its (private) NVPTX subtarget; with no PTX
  // feature it emits the minimum, so read ".version" of an empty module.
  static std::mutex mutex;
  static std::map<std::string, int> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(arch);
  if (it != cache.end())
    return it->second;
  llvm::LLVMContext ctx;
  llvm::Module module("empty", ctx);
  std::unique_ptr<llvm::TargetMachine> tm = createTargetMachine(arch, "", 0);
  module.setTargetTriple(llvm::Triple(kTriple));
  module.setDataLayout(tm->createDataLayout());
  std::string ptx = emitPtx(module, *tm);
  llvm::StringRef rest = llvm::StringRef(ptx).split(".version ").second;
  auto [major, minor] = rest.take_until(llvm::isSpace).split('.');
  int maj = 0, min = 0;
  if (major.getAsInteger(10, maj) || minor.getAsInteger(10, min))
    throw CompileError("cannot read the PTX version LLVM emits for " + arch);
  return cache[arch] = maj * 10 + min;
}

int driverPtxVersion(int driverVersion) {
  int major = driverVersion / 1000, minor = (driverVersion % 1000) / 10;
  if (major >= 13)
    return 90 + (major - 13) * 10 + minor; // 13.0 -> 9.0, 13.1 -> 9.1
  if (major == 12) {
    // 12.0 .. 12.5 -> 8.0 .. 8.5; 12.6 -> 8.5; 12.8 -> 8.7; 12.9 -> 8.8.
    static const int ptx[] = {80, 81, 82, 83, 84, 85, 85, 86, 87, 88};
    return ptx[std::min(minor, 9)];
  }
  if (major == 11)
    return 70 + std::min(minor, 8); // 11.0 -> 7.0 ... 11.8 -> 7.8
  return 0;
}

int choosePtxVersion(const std::string &arch, int driverVersion) {
  int version = std::max(minPtxVersion(arch), driverPtxVersion(driverVersion));
  // The largest version LLVM emits that is not above the chosen one (LLVM's
  // list has gaps, e.g. no 8.9).
  int chosen = minPtxVersion(arch);
  for (int v : nvptxTables().ptxVersions)
    if (v <= version && v > chosen)
      chosen = v;
  return chosen;
}

void checkTarget(const PtxOptions &opts) {
  int minVersion = minPtxVersion(opts.arch); // Throws for unknown archs.
  auto isa = [](int v) {
    return std::to_string(v / 10) + "." + std::to_string(v % 10);
  };
  if (!llvm::is_contained(nvptxTables().ptxVersions, opts.ptxVersion))
    throw CompileError("LLVM's NVPTX backend cannot emit PTX ISA version " +
                       isa(opts.ptxVersion) + " (ptxVersion " +
                       std::to_string(opts.ptxVersion) +
                       "; highest: " + isa(maxPtxVersion()) + ")");
  if (opts.ptxVersion < minVersion)
    throw CompileError(opts.arch + " needs PTX ISA version " + isa(minVersion) +
                       " or later (ptxVersion " +
                       std::to_string(opts.ptxVersion) + ")");
  if (opts.optLevel < 0 || opts.optLevel > 3)
    throw CompileError("optLevel must be 0..3, not " +
                       std::to_string(opts.optLevel));
}

std::string gpuModuleToLLVMIR(ModuleOp module, const PtxOptions &opts) {
  OptimizedModule optimized =
      translateAndOptimize(checkedGpuModule(module, opts), opts);
  std::string text;
  llvm::raw_string_ostream os(text);
  optimized.module->print(os, nullptr);
  return text;
}

std::string gpuModuleToPtx(ModuleOp module, const PtxOptions &opts) {
  return gpuModuleToPtx(checkedGpuModule(module, opts), opts);
}

std::string gpuModuleToPtx(gpu::GPUModuleOp gpuModule, const PtxOptions &opts) {
  OptimizedModule optimized = translateAndOptimize(gpuModule, opts);
  std::string ptx = emitPtx(*optimized.module, *optimized.targetMachine);
  optimized.diagnostics->throwIfAny("PTX code generation failed");
  return ptx;
}

} // namespace flashjit
