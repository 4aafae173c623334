//===- Compiler.cpp - Stages of the pipeline, for the tools ---------------===//

#include "compiler/CompilerInternal.h"
#include "compiler/Conversion/KernelEmitters.h"
#include "compiler/Pipelines/Pipelines.h"
#include "compiler/Target/PTXEmitter.h"
#include "dialects/Attn/IR/AttnDialect.h"
#include "kernels/GpuGeometry.h"
#include "kernels/KernelABI.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/LLVMIR/Export.h"

#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/Support/raw_ostream.h"

#include <fmt/format.h>

using namespace mlir;

namespace flashjit {

Stage parseStage(const std::string &name) {
  static const std::pair<const char *, Stage> stages[] = {
      {"attn", Stage::Attn},   {"tile", Stage::Tile},
      {"tiled", Stage::Tile},  {"gpu", Stage::Gpu},
      {"llvm", Stage::Llvm},   {"ptx", Stage::Ptx},
      {"cubin", Stage::Cubin}, {"cpu-llvm", Stage::CpuLlvm}};
  for (auto &[n, stage] : stages)
    if (name == n)
      return stage;
  throw SpecError(fmt::format("--emit: unknown stage '{}' (expected attn, "
                              "tile, gpu, llvm, ptx, cubin or cpu-llvm)",
                              name));
}

std::unique_ptr<MLIRContext> createContext() {
  DialectRegistry registry;
  registerFlashjitDialects(registry);
  auto ctx =
      std::make_unique<MLIRContext>(registry, MLIRContext::Threading::DISABLED);
  ctx->loadAllAvailableDialects();
  return ctx;
}

DiagnosticCollector::DiagnosticCollector(MLIRContext &ctx, bool oneLine)
    : handler(&ctx, [this, oneLine](Diagnostic &diag) {
        if (!text.empty())
          text += oneLine ? "; " : "\n";
        text += diag.str();
        if (!oneLine)
          for (Diagnostic &note : diag.getNotes())
            text += "\n  note: " + note.str();
        return success();
      }) {}

OwningOpRef<ModuleOp> parseAttnModule(MLIRContext &ctx,
                                      const AttentionSpec &spec) {
  DiagnosticCollector diags(ctx);
  auto module = parseSourceString<ModuleOp>(attnModuleText(spec, kKernelName),
                                            &ctx, "attn-description");
  if (!module)
    throw CompileError("invalid attention description: " + diags.str());
  return module;
}

/// The description an attn op carries.
template <typename OpT>
static AttentionSpec specFromOp(OpT op, Direction direction,
                                bool deterministic) {
  return conversion::describedSpec(
      direction, op.getHeadDimQkAttr().getInt(), op.getHeadDimVAttr().getInt(),
      op.getElementType(), op.getMask(), op.getGqaAttr().getInt(),
      op.getSparseBlockAttr().getInt(), deterministic);
}

/// Thrown for a tile stage whose score_mod is no named variant, or that
/// has inlined a mask_mod: the region is inlined there, so the reference
/// has nothing to evaluate.
static CompileError customTileScoreMod(bool mask) {
  return CompileError(
      mask ? "the tile stage has inlined a mask_mod region, so the float64 "
             "reference cannot evaluate it: give the attn stage that holds "
             "the region (--emit attn)"
           : "the tile stage's score_mod is no named variant "
             "(softcap:C = C * tanh(score / C), alibi:H = score + "
             "2^(-8 (h + 1) / H) * (kv_idx - q_idx)) and its region "
             "is inlined there, so the float64 reference cannot "
             "evaluate it: give the attn stage that holds the "
             "region (--emit attn)");
}

/// \p op's score modifier into \p spec: the named variant ("softcap:C",
/// "alibi:H") that its score_mod region is, "" without a region, or
/// "custom" with the region's float64 evaluation for the reference.
template <typename OpT> static void readScoreMod(OpT op, AttentionSpec &spec) {
  describeModifiers(op, op.namedScoreMod(), op.getScoreMod(), op.getMaskMod(),
                    spec);
}

/// The kernel names the runtime looks up for \p direction.
static bool isKernelName(StringRef name, Direction direction) {
  std::string base = kKernelName;
  if (direction == Direction::Forward)
    return name == base;
  return name == base || name == base + abi::bwd::kPreprocessSuffix ||
         name == base + abi::bwd::kDqSuffix;
}

/// Reads what \p module holds (see inspectSource).
static SourceInfo describeModule(ModuleOp module, const std::string &name) {
  SourceInfo info;
  int described = 0;
  auto fail = [&](const std::string &why) {
    throw CompileError(fmt::format("{}: {}", name, why));
  };
  auto expectName = [&](StringRef sym, Direction direction) {
    if (!isKernelName(sym, direction))
      fail(fmt::format("the kernel must be named @{}{} (the runtime launches "
                       "that name), got @{}",
                       kKernelName,
                       direction == Direction::Forward
                           ? ""
                           : " (and its _preprocess, _dq functions)",
                       sym.str()));
  };
  module.walk([&](Operation *op) {
    if (auto fwd = dyn_cast<attn::FlashFwdOp>(op)) {
      expectName(fwd.getSymName(), Direction::Forward);
      info.spec = specFromOp(fwd, Direction::Forward, false);
      readScoreMod(fwd, info.spec);
      ++described;
    } else if (auto bwd = dyn_cast<attn::FlashBwdOp>(op)) {
      expectName(bwd.getSymName(), Direction::Backward);
      info.spec = specFromOp(bwd, Direction::Backward, bwd.getDeterministic());
      readScoreMod(bwd, info.spec);
      info.spec.captureGrads = bwd.getCaptureGrads();
      ++described;
    }
  });
  if (described > 1)
    fail("holds several attn descriptions; give one kernel per file");
  if (described == 1)
    return info;
  std::optional<std::string> specJson;
  module.walk([&](func::FuncOp fn) {
    auto attr = fn->getAttrOfType<attn::KernelAttr>("attn.kernel");
    if (!attr)
      return;
    AttentionSpec spec = conversion::specFromAttr(attr);
    if (attr.getScoreMod() == kCustomScoreMod || !attr.getMaskMod().empty())
      throw customTileScoreMod(!attr.getMaskMod().empty());
    spec.scoreMod = attr.getScoreMod().str();
    expectName(fn.getName(), spec.direction);
    if (specJson && *specJson != spec.toJson())
      fail("its kernel functions describe different attentions");
    specJson = spec.toJson();
    info.spec = spec;
    // The kernel's Br x Bc are the forward's or the dK/dV kernel's: the
    // separate dQ pass has tiles of its own (dqPassTiles), and the row
    // kernels carry the main kernel's.
    if (attr.getRole() != "forward" && attr.getRole() != "main" &&
        attr.getRole() != "forward_split")
      return;
    TileConfig tiling;
    tiling.blockM = attr.getBlockM();
    tiling.blockN = attr.getBlockN();
    if (attr.getRole() == "forward_split")
      tiling.splits = TileConfig::kAutoSplits;
    info.tiling = tiling;
  });
  if (!specJson)
    fail("holds no kernel: neither an attn.flash_fwd / attn.flash_bwd op nor "
         "a function with attn.kernel = #attn.kernel<...>");
  info.stage = Stage::Tile;
  return info;
}

/// MLIR's parser sizes a multi-result op's forward references by the
/// largest result number used (`%x#N`): a mutated number such as
/// %r#2147483648 would allocate without bound. Such a reference is refused
/// before parsing (flashjit's kernels use at most a few hundred results).
static void checkResultNumbers(const KernelSource &source) {
  const std::string &t = source.text;
  for (size_t at = t.find('#'); at != std::string::npos;
       at = t.find('#', at + 1)) {
    if (at == 0 ||
        !(std::isalnum((unsigned char)t[at - 1]) || t[at - 1] == '_'))
      continue;
    size_t end = at + 1;
    while (end < t.size() && std::isdigit((unsigned char)t[end]))
      ++end;
    if (end == at + 1)
      continue;
    size_t start = at;
    while (start > 0 && t[start - 1] != '%' &&
           !std::isspace((unsigned char)t[start - 1]))
      --start;
    if (start == 0 || t[start - 1] != '%')
      continue;
    if (end - at - 1 > 5 || std::stol(t.substr(at + 1, end - at - 1)) > 65535)
      throw CompileError(fmt::format(
          "{}: result number {} is out of range (at most 65535)", source.name,
          t.substr(at + 1, std::min<size_t>(end - at - 1, 24))));
  }
}

/// Parses \p source (or the attn stage of \p spec when it is empty); sets
/// \p tiled when it holds the tile stage, whose tiling must be \p config's.
static OwningOpRef<ModuleOp> loadModule(MLIRContext &ctx,
                                        const AttentionSpec &spec,
                                        const KernelSource &source,
                                        const TileConfig &config, bool &tiled) {
  tiled = false;
  if (source.empty()) {
    OwningOpRef<ModuleOp> module = parseAttnModule(ctx, spec);
    checkScoreModCaptures(*module, spec);
    return module;
  }
  checkResultNumbers(source);
  DiagnosticCollector diags(ctx);
  auto module = parseSourceString<ModuleOp>(source.text, &ctx, source.name);
  if (!module)
    throw CompileError(
        fmt::format("{}: invalid IR: {}", source.name, diags.str()));
  SourceInfo info = describeModule(*module, source.name);
  if (info.spec.toJson() != spec.toJson())
    throw CompileError(fmt::format("{} describes {}, not {}", source.name,
                                   info.spec.toJson(), spec.toJson()));
  tiled = info.stage == Stage::Tile;
  if (tiled && (info.tiling->blockM != config.blockM ||
                info.tiling->blockN != config.blockN))
    throw CompileError(
        fmt::format("{} is tiled {} x {}; it cannot be compiled as {} x {}",
                    source.name, info.tiling->blockM, info.tiling->blockN,
                    config.blockM, config.blockN));
  if (tiled && (info.tiling->splits != 0) != (config.splits != 0))
    throw CompileError(
        fmt::format("{} is {}a split-KV forward; compile it {} --kv-splits",
                    source.name, info.tiling->splits ? "" : "not ",
                    info.tiling->splits ? "with" : "without"));
  return module;
}

SourceInfo inspectSource(const KernelSource &source) {
  checkResultNumbers(source);
  auto ctx = createContext();
  DiagnosticCollector diags(*ctx);
  auto module =
      parseSourceString<ModuleOp>(source.text, ctx.get(), source.name);
  if (!module)
    throw CompileError(
        fmt::format("{}: invalid IR: {}", source.name, diags.str()));
  return describeModule(*module, source.name);
}

KernelSource forwardSourceOf(const KernelSource &backward) {
  auto ctx = createContext();
  DiagnosticCollector diags(*ctx);
  auto module =
      parseSourceString<ModuleOp>(backward.text, ctx.get(), backward.name);
  attn::FlashBwdOp bwd;
  if (module && !module->getOps<attn::FlashBwdOp>().empty())
    bwd = *module->getOps<attn::FlashBwdOp>().begin();
  if (!bwd)
    throw CompileError(fmt::format(
        "{}: no attn.flash_bwd description to take the forward of{}",
        backward.name, module ? "" : ": " + diags.str()));
  OpBuilder b(ctx.get());
  OwningOpRef<ModuleOp> fwdModule = ModuleOp::create(bwd.getLoc());
  b.setInsertionPointToEnd(fwdModule->getBody());
  OperationState state(bwd.getLoc(), attn::FlashFwdOp::getOperationName());
  for (NamedAttribute a : bwd->getAttrs())
    if (a.getName() != "deterministic" && a.getName() != "capture_grads")
      state.addAttribute(a.getName(), a.getValue());
  IRMapping mapping;
  bwd.getScoreMod().cloneInto(state.addRegion(), mapping);
  bwd.getMaskMod().cloneInto(state.addRegion(), mapping);
  b.create(state);
  if (failed(verify(*fwdModule)))
    throw CompileError(fmt::format("{}: its forward does not verify: {}",
                                   backward.name, diags.str()));
  KernelSource out;
  llvm::raw_string_ostream os(out.text);
  fwdModule->print(os);
  out.name = backward.name + " (its forward)";
  return out;
}

OwningOpRef<ModuleOp>
loadSource(MLIRContext &ctx, const AttentionSpec &spec,
           const KernelSource &source, const TileConfig &config,
           const std::function<void(OpPassManager &)> &afterTiling) {
  bool tiled = false;
  OwningOpRef<ModuleOp> module = loadModule(ctx, spec, source, config, tiled);
  runPipeline(*module, [&](OpPassManager &pm) {
    if (!tiled)
      buildTilingPipeline(pm, config);
    if (afterTiling)
      afterTiling(pm);
  });
  return module;
}

void runPipeline(ModuleOp module,
                 const std::function<void(OpPassManager &)> &build) {
  DiagnosticCollector diags(*module.getContext());
  PassManager pm(module.getContext());
  build(pm);
  if (failed(pm.run(module)))
    throw CompileError("pipeline failed: " + diags.str());
}

/// Checks that \p config and \p target can make a GPU kernel for \p spec.
static PtxOptions checkGpuRequest(const AttentionSpec &spec,
                                  const TileConfig &config,
                                  const GpuTarget &target) {
  std::string problem =
      spec.direction == Direction::Backward
          ? gpuBackwardConfigProblem(spec, config, 227 * 1024)
          : gpuConfigProblem(spec, config, 227 * 1024, usesKvRing(target));
  if (!problem.empty())
    throw SpecError(problem);
  if (target.copyBytes != 2 && target.copyBytes != 4 && target.copyBytes != 8 &&
      target.copyBytes != 16)
    throw SpecError(fmt::format(
        "copy width must be 2, 4, 8 or 16 bytes, got {}", target.copyBytes));
  PtxOptions ptx;
  ptx.arch = target.arch;
  ptx.ptxVersion = choosePtxVersion(target.arch, target.driverVersion);
  checkTarget(ptx); // a named error, never an LLVM "Cannot select"
  return ptx;
}

/// Runs the GPU pipeline on \p source (the attn stage of \p spec when
/// empty).
static OwningOpRef<ModuleOp> lowerToGpu(MLIRContext &ctx,
                                        const AttentionSpec &spec,
                                        const TileConfig &config,
                                        const GpuTarget &target, bool stopAtGpu,
                                        const KernelSource &source) {
  GpuLoweringConfig gpu;
  gpu.copyBytes = target.copyBytes;
  gpu.vectorAtomics = usesVectorAtomics(target);
  gpu.wgmma = usesWgmma(target);
  gpu.bulkDq = usesBulkDq(target);
  gpu.bwdRingStages = backwardRingStages(target);
  gpu.bwdStages = backwardStages(target);
  gpu.splitCommits = usesSplitCommits(target);
  gpu.bwdStagedStores = usesBackwardStagedStores(target);
  gpu.kvRingStages = usesKvRing(target) ? config.stages : 0;
  gpu.pingPong = pingPongMode(target, config, &spec);
  gpu.persistent = usesPersistentKernel(target, config);
  gpu.tma = tensorMapMode(target, config);
  gpu.stagedStores = usesStagedStores();
  gpu.exp2Emulation = exp2EmulationEighths(target, &spec);
  gpu.tanhPolynomial = tanhPolynomialEighths();
  return loadSource(ctx, spec, source, config, [&](OpPassManager &pm) {
    buildGpuLoweringPipeline(pm, config.warps, gpu, stopAtGpu);
  });
}

/// The integer attribute \p name of \p dict, or -1.
static int64_t intAttr(DictionaryAttr dict, StringRef name) {
  auto a = dict ? dyn_cast_or_null<IntegerAttr>(dict.get(name)) : nullptr;
  return a ? a.getInt() : -1;
}

/// The index of \p name among \p count names of \p nameOf, or -1.
template <typename NameOf>
static int abiIndex(Attribute name, int count, NameOf nameOf) {
  auto str = dyn_cast_or_null<StringAttr>(name);
  for (int i = 0; str && i < count; ++i)
    if (str.getValue() == nameOf(i))
      return i;
  return -1;
}

/// The tensor maps recorded as \p fn's attn.tensor_maps (KernelLaunch.h),
/// in the indices of the ABI the entry names (`abi = "bwd"`: the
/// backward's; else the forward's); throws CompileError for a malformed
/// record.
static std::vector<TensorMapRecord> readTensorMaps(Operation *fn) {
  std::vector<TensorMapRecord> out;
  auto maps = fn->getAttrOfType<ArrayAttr>("attn.tensor_maps");
  if (!maps)
    return out;
  for (Attribute a : maps) {
    auto dict = dyn_cast<DictionaryAttr>(a);
    TensorMapRecord m;
    auto abiName =
        dict ? dyn_cast_or_null<StringAttr>(dict.get("abi")) : nullptr;
    m.backward = abiName && abiName.getValue() == "bwd";
    auto index = [&](Attribute name) {
      return abiIndex(name, m.numIndexArgs(),
                      [&](int i) { return m.indexName(i); });
    };
    m.buffer = abiIndex(dict ? dict.get("tensor") : Attribute(), m.numBuffers(),
                        [&](int i) { return m.bufferName(i); });
    m.rows = index(dict ? dict.get("rows") : Attribute());
    m.rowStride = index(dict ? dict.get("row_stride") : Attribute());
    m.cols = intAttr(dict, "cols");
    auto outer =
        dict ? dyn_cast_or_null<ArrayAttr>(dict.get("outer")) : nullptr;
    auto box =
        dict ? dyn_cast_or_null<DenseI64ArrayAttr>(dict.get("box")) : nullptr;
    if (outer)
      for (Attribute o : outer)
        m.outer.push_back(index(o));
    if (box && box.size() == 2) {
      m.boxCols = box[0];
      m.boxRows = box[1];
    }
    if (!outer || (abiName && !m.backward) || !m.valid())
      throw CompileError("malformed attn.tensor_maps entry (tensor, rows, "
                         "row_stride, outer: the ABI's names; cols; box = "
                         "[cols, rows]; abi = \"bwd\" or none)");
    out.push_back(m);
  }
  return out;
}

/// The launch resources that the GPU lowering recorded on \p fn (a
/// gpu.func kernel, or the llvm.func marked gpu.kernel it becomes) of
/// \p blockSize threads; throws CompileError for a kernel without them.
static KernelLaunch readKernelLaunch(Operation *fn, StringRef name,
                                     DenseI32ArrayAttr blockSize) {
  KernelLaunch k;
  k.name = name.str();
  if (blockSize && blockSize.size() == 3)
    k.threads = blockSize[0];
  if (auto shared = fn->getAttrOfType<IntegerAttr>("attn.shared_bytes"))
    k.sharedBytes = shared.getInt();
  auto grid = fn->getAttrOfType<DictionaryAttr>("attn.grid");
  k.rows = intAttr(grid, "rows");
  k.programsZ = intAttr(grid, "z");
  k.kvSplit = grid && grid.get("split");
  k.persistent = grid && grid.get("persistent");
  k.scheduled = grid && grid.get("scheduled");
  k.tensorMaps = readTensorMaps(fn);
  auto str = [&](StringRef key) {
    auto a = grid ? dyn_cast_or_null<StringAttr>(grid.get(key)) : nullptr;
    return a ? a.getValue() : StringRef();
  };
  k.overKeys = str("sequence") == kGridKeys;
  k.kvHeads = str("heads") == kGridKvHeads;
  bool named = (k.overKeys || str("sequence") == kGridQueries) &&
               (k.kvHeads || str("heads") == kGridAllHeads);
  if (!named || !k.valid() || !fn->hasAttr("attn.shared_bytes"))
    throw CompileError("kernel '" + k.name +
                       "' does not record its launch resources "
                       "(known_block_size, attn.shared_bytes, attn.grid = "
                       "{heads, rows, sequence, z})");
  return k;
}

/// The recorded launches of every kernel of \p module, before or after
/// the NVVM conversion.
static std::vector<KernelLaunch> readKernelLaunches(ModuleOp module) {
  std::vector<KernelLaunch> out;
  module.walk([&](mlir::gpu::GPUFuncOp fn) {
    if (fn.isKernel())
      out.push_back(
          readKernelLaunch(fn, fn.getName(), fn.getKnownBlockSizeAttr()));
  });
  module.walk([&](LLVM::LLVMFuncOp fn) {
    if (fn->hasAttr("gpu.kernel"))
      out.push_back(readKernelLaunch(
          fn, fn.getSymName(),
          fn->getAttrOfType<DenseI32ArrayAttr>("gpu.known_block_size")));
  });
  return out;
}

/// Checks the request, then lowers to the GPU module in \p ctx (in NVVM,
/// or with \p stopAtGpu at the gpu.func stage); \p ptx gets the PTX
/// options of the target.
static OwningOpRef<ModuleOp>
checkedGpuModule(MLIRContext &ctx, const AttentionSpec &spec,
                 const TileConfig &config, const GpuTarget &target,
                 const KernelSource &source, bool stopAtGpu, PtxOptions &ptx) {
  spec.validate();
  config.validate(spec);
  ptx = checkGpuRequest(spec, config, target);
  return lowerToGpu(ctx, spec, config, target, stopAtGpu, source);
}

GpuCompilation compileForGpu(const AttentionSpec &spec,
                             const TileConfig &config, const GpuTarget &target,
                             const KernelSource &source) {
  auto ctx = createContext();
  PtxOptions ptx;
  auto module =
      checkedGpuModule(*ctx, spec, config, target, source, false, ptx);
  GpuCompilation out;
  out.kernels = readKernelLaunches(*module);
  out.ptx = gpuModuleToPtx(*module, ptx);
  return out;
}

std::vector<KernelLaunch> gpuKernelLaunches(const AttentionSpec &spec,
                                            const TileConfig &config,
                                            const GpuTarget &target,
                                            const KernelSource &source) {
  auto ctx = createContext();
  PtxOptions ptx;
  return readKernelLaunches(*checkedGpuModule(*ctx, spec, config, target,
                                              source, /*stopAtGpu=*/true, ptx));
}

std::string compileToPtx(const AttentionSpec &spec, const TileConfig &config,
                         const GpuTarget &target, const KernelSource &source) {
  return compileForGpu(spec, config, target, source).ptx;
}

std::string emitStage(const AttentionSpec &spec, const TileConfig &config,
                      Stage stage, const GpuTarget &target,
                      const KernelSource &source) {
  spec.validate();
  config.validate(spec);
  auto ctx = createContext();
  std::string out;
  llvm::raw_string_ostream os(out);
  switch (stage) {
  case Stage::Attn: {
    bool tiled = false;
    OwningOpRef<ModuleOp> module =
        loadModule(*ctx, spec, source, config, tiled);
    if (tiled)
      throw SpecError(fmt::format("--emit attn: {} holds the tile stage, "
                                  "which comes after attn",
                                  source.name));
    module->print(os);
    break;
  }
  case Stage::Tile:
    loadSource(*ctx, spec, source, config, nullptr)->print(os);
    break;
  case Stage::Gpu:
    checkGpuRequest(spec, config, target);
    lowerToGpu(*ctx, spec, config, target, true, source)->print(os);
    break;
  case Stage::Llvm:
  case Stage::Ptx: {
    PtxOptions ptx = checkGpuRequest(spec, config, target);
    auto gpuModule = lowerToGpu(*ctx, spec, config, target, false, source);
    os << (stage == Stage::Llvm ? gpuModuleToLLVMIR(*gpuModule, ptx)
                                : gpuModuleToPtx(*gpuModule, ptx));
    break;
  }
  case Stage::Cubin:
    throw SpecError("emitStage: the cubin is made from the PTX by nvJitLink");
  case Stage::CpuLlvm: {
    auto module = loadSource(*ctx, spec, source, config, [](OpPassManager &pm) {
      buildCpuLoweringPipeline(pm);
    });
    llvm::LLVMContext llvmCtx;
    auto llvmModule = translateModuleToLLVMIR(*module, llvmCtx);
    if (!llvmModule)
      throw CompileError("translation to LLVM IR failed");
    llvmModule->print(os, nullptr);
    break;
  }
  }
  return out;
}

} // namespace flashjit
