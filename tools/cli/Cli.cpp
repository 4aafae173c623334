//===- Cli.cpp - The flashjit command line --------------------------------===//
//
/// \file
/// `flashjit compile` and `flashjit run`. The whole CLI lives inside
/// libflashjit.so behind one C entry point, flashjit_cli_main, so the
/// flashjit binary is a three-line main() and no C++ crosses the library's
/// boundary.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/GpuGeometry.h"
#include "kernels/HostTensor.h"
#include "kernels/Varlen.h"
#include "runtime/CudaDriver.h"
#include "runtime/Error.h"
#include "runtime/NvJitLink.h"
#include "tools/cli/BackwardCommand.h"
#include "tools/cli/CliOptions.h"
#include "tools/cli/GpuCommands.h"
#include "tools/cli/MaskBlocksRun.h"
#include "tools/engine/BuildId.h"
#include "tools/engine/Stopwatch.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <llvm/Config/llvm-config.h>
#include <optional>
#include <random>

namespace flashjit::cli {
namespace {

/// The exit codes (README, `flashjit run --help`). Internal is a bug in
/// flashjit: every bad input is a named error with Usage.
enum ExitCode {
  Ok = 0,
  AccuracyFailed = 1,
  Usage = 2,
  NoDriver = 3,
  Internal = 4
};

/// Where stdout-bound text goes: the file of -o, or stdout.
void writeOutput(const CliOptions &o, const std::string &text) {
  if (o.outputPath.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }
  std::ofstream out(o.outputPath, std::ios::binary);
  out << text;
  out.close(); // a full disk shows when the buffer is flushed
  if (!out)
    throw SpecError(fmt::format("-o: cannot write '{}'", o.outputPath));
}

using engine::msSince;

#ifndef FLASHJIT_VERSION
#define FLASHJIT_VERSION "unknown"
#endif

/// `flashjit --version`: flashjit's version and build id (the one in the
/// cache keys: engine::compilerBuildId), the LLVM/MLIR it was built
/// with, and the CUDA driver and nvJitLink it finds (both dlopen'ed at run
/// time: "not found" with the reason when absent, never an error).
/// \p reason without a leading \p prefix ("nvJitLink not found: ").
std::string withoutPrefix(const std::string &reason, const char *prefix) {
  return reason.rfind(prefix, 0) == 0 ? reason.substr(std::strlen(prefix))
                                      : reason;
}

std::string versionText() {
  std::string text = fmt::format("flashjit {}\nbuild-id: {}\nLLVM/MLIR: {}\n",
                                 FLASHJIT_VERSION, engine::compilerBuildId(),
                                 LLVM_VERSION_STRING);
  rt::NvJitLink &link = rt::NvJitLink::get();
  if (link.available())
    text += fmt::format("nvJitLink: {} ({})\n",
                        rt::nvJitLinkVersionString(link), link.libraryPath());
  else
    text += fmt::format(
        "nvJitLink: not found ({})\n",
        withoutPrefix(link.unavailableReason(), "nvJitLink not found: "));
  rt::CudaDriver &driver = rt::CudaDriver::get();
  if (!driver.available()) {
    text += fmt::format(
        "CUDA driver: not found ({})\n",
        withoutPrefix(driver.unavailableReason(), "no CUDA driver found: "));
    return text;
  }
  int v = driver.driverVersion();
  text += fmt::format("CUDA driver: {}.{} ({})\n", v / 1000, (v % 1000) / 10,
                      driver.libraryPath());
  try {
    int count = driver.deviceCount();
    for (int d = 0; d < count; ++d) {
      rt::DeviceInfo info = rt::queryDevice(d, driver);
      text += fmt::format("GPU {}: {} ({})\n", d, info.name, info.targetArch());
    }
    if (count == 0)
      text += "GPU: none\n";
  } catch (const std::exception &e) {
    text += fmt::format("GPU: not queried ({})\n", e.what());
  }
  return text;
}

/// The tiling `compile` compiles: an --input file's, or the flags'
/// (flagTiling: switches alone switch the default below), else, for a
/// forward, the target's default tiling (targetDefaultTiling: what `run`
/// and `bench` take untuned on such a GPU) at every stage but cpu-llvm,
/// which keeps the generic tiling the CPU runs (o.config).
TileConfig compileTiling(const CliOptions &o, Stage stage,
                         const GpuTarget &target) {
  if (!o.source.empty() || o.spec.direction != Direction::Forward ||
      stage == Stage::CpuLlvm)
    return o.config;
  TileConfig targetDefault = targetDefaultTiling(o.spec, target);
  return flagTiling(o, targetDefault).value_or(targetDefault);
}

int runCompile(const CliOptions &o) {
  Stage stage = parseStage(o.emit);
  GpuTarget target = resolveTarget(o, /*copyBytes=*/16);
  const TileConfig config = compileTiling(o, stage, target);
  config.validate(o.spec);
  if (stage == Stage::Cubin) {
    if (o.outputPath.empty())
      throw SpecError("--emit cubin writes a binary: give -o FILE");
    rt::DiskCache cache;
    CubinBuild b = engine::buildCubin(o.spec, config, target, cache, o.source,
                                      engine::Assembler::Cubin);
    std::ofstream out(o.outputPath, std::ios::binary);
    out.write(b.image.cubin.data(), std::streamsize(b.image.cubin.size()));
    out.close();
    if (!out)
      throw SpecError(fmt::format("-o: cannot write '{}'", o.outputPath));
    // nvJitLink assembles PTX as a separate unit, where ptxas serialises
    // warpgroup MMAs and ignores setmaxnreg; run and bench have the
    // driver's JIT assemble such a kernel whole (README, "Whole-program
    // assembly").
    if (b.wholeProgram)
      fmt::print(stderr,
                 "note: this cubin is nvJitLink's separately compiled unit: "
                 "ptxas serialised its warpgroup MMAs and ignored setmaxnreg "
                 "(C7509, C7504); run and bench have the driver's JIT "
                 "assemble the PTX whole (--emit ptx gives it)\n");
    // What a launcher of this cubin needs: the resources each kernel's
    // lowering recorded (kernels/KernelLaunch.h).
    std::string kernels, lines;
    for (const KernelLaunch &k : b.image.kernels) {
      std::string grid = k.describeGrid(), maps = k.describeTensorMaps();
      kernels +=
          fmt::format("{}{{\"name\":\"{}\",\"threads\":{},\"shared_bytes\":{},"
                      "\"grid\":\"{}\",\"tensor_maps\":\"{}\"}}",
                      kernels.empty() ? "" : ",", k.name, k.threads,
                      k.sharedBytes, grid, maps);
      lines += fmt::format("  {}: {} threads, {} bytes of shared memory, grid "
                           "{}{}\n",
                           k.name, k.threads, k.sharedBytes, grid,
                           maps.empty() ? ""
                                        : "; after the ABI's arguments, "
                                          "tensor maps (__grid_constant__) " +
                                              maps);
    }
    if (o.json)
      fmt::print("{{\"stage\":\"cubin\",\"spec\":{},\"config\":{},"
                 "\"arch\":\"{}\",\"bytes\":{},\"registers\":{},"
                 "\"spill_bytes\":{},\"cache\":\"{}\",\"prepare_ms\":{:.3f},"
                 "\"output\":\"{}\",\"kernels\":[{}]}}\n",
                 o.spec.toJson(), config.toJson(), target.arch,
                 b.image.cubin.size(), b.registers, b.spillBytes,
                 rt::toString(b.cache), b.prepareMs, o.outputPath, kernels);
    else
      fmt::print(stderr,
                 "{}: {} bytes for {}; {} registers, {} bytes spilled; "
                 "cubin cache {}\n{}",
                 o.outputPath, b.image.cubin.size(), target.arch, b.registers,
                 b.spillBytes, rt::toString(b.cache), lines);
    return Ok;
  }
  std::string text = emitStage(o.spec, config, stage, target, o.source);
  if (!text.empty() && text.back() != '\n')
    text += '\n';
  writeOutput(o, text);
  return Ok;
}

/// `run`, `bench` (GPU, more repeats, a sampled check) and `tune` (GPU,
/// tunes first).
int runRun(const CliOptions &o) {
  const bool bench = o.command == "bench", tune = o.command == "tune";
  Device device = bench || tune ? Device::Cuda : resolveDevice(o);
  if (device == Device::Cuda)
    rt::CudaDriver::get().requireAvailable();
  const AttentionSpec &spec = o.spec;
  const Problem &p = o.problem;

  RandomRun inputs = makeRandomRun(o, spec);
  const uint64_t layoutSeed = inputs.layoutSeed, inputSeed = inputs.inputSeed;
  std::unique_ptr<BlockSparseLayout> layout = std::move(inputs.layout);
  AttentionData &data = inputs.data;
  std::optional<MaskBlocksRun> blocks;
  if (o.maskBlocks) {
    blocks = classifyMaskBlocks(o, spec, data, device == Device::Cuda,
                                bench ? o.repeats : 5);
    layout = std::move(blocks->layout);
  }

  double compileMs = 0, runMs = 0;
  GpuRunResult gpu;
  if (device == Device::Cuda) {
    gpu =
        runOnGpu(o, data, layout.get(), bench ? o.repeats : 5, tune || o.tune);
    printTuneOutcome(o, gpu, p);
    compileMs = gpu.compileMs;
    runMs = gpu.medianMs;
  } else {
    auto t0 = std::chrono::steady_clock::now();
    auto kernel = CpuKernel::compile(spec, o.config, o.source);
    compileMs = msSince(t0);
    t0 = std::chrono::steady_clock::now();
    kernel->run(p, data, layout.get());
    runMs = msSince(t0);
  }

  // Large problems check a sample of rows (the float64 reference is slow);
  // a varlen batch, every sequence against its own reference: every row
  // with `run`, a sample within bench's budget with `bench`.
  const double checkWork = bench ? 5e8 : 4e9;
  ErrorReport err;
  int64_t rowsChecked = 0;
  if (spec.varlen) {
    // --mask-blocks: the reference of the mask alone (no layout), so that a
    // block the classification got wrong fails the check.
    err = checkVarlenForward(spec, p, data, bench ? checkWork : 1e300,
                             &rowsChecked, blocks ? nullptr : layout.get());
  } else {
    ReferenceResult ref = referenceForward(
        spec, p, data, blocks ? nullptr : layout.get(), checkWork);
    rowsChecked = int64_t(ref.rows.size());
    err = compareWithReference(spec, p, data, ref);
  }
  double bound = errorBound(spec.dtype);
  double relErr = err.relErr();
  bool ok = relErr < bound && (!blocks || !blocks->checked || blocks->matches);
  if (!o.dumpDir.empty())
    dumpForwardIO(o.dumpDir, spec, p, data, layout.get());

  // JSON has no infinity: a NaN or a wrong -inf pattern reports 1e30.
  double reported = std::isfinite(relErr) ? relErr : 1e30;
  const char *deviceName = device == Device::Cuda ? "cuda" : "cpu";
  double tflops = device == Device::Cuda
                      ? forwardFlops(spec, p, &data) / (runMs * 1e-3) / 1e12
                      : 0.0;
  const TileConfig &config = device == Device::Cuda ? gpu.config : o.config;
  std::string gpuFields = ",\"cache\":null";
  if (device == Device::Cuda) {
    // Which MMAs the kernel's products took (the lowering's wgmma option
    // on sm_90a, where the tiles have the shape).
    GpuTarget target;
    target.arch = gpu.arch;
    const GpuGeometry geo = gpuGeometry(spec, config, usesKvRing(target));
    const bool wgmma = usesWgmma(target) && geo.wgmmaShape;
    gpuFields =
        gpuJsonFields(gpu, tflops, bench ? o.repeats : 5, o.coldL2) +
        fmt::format(",\"mma\":\"{}\",\"kv_ring\":{},\"ping_pong\":{},"
                    "\"kv_splits\":{},\"persistent\":{},\"tma\":{},"
                    "\"tensor_maps\":{},\"tile_schedule\":{}",
                    wgmma ? "wgmma" : "mma.sync", geo.ringStages,
                    geo.ringStages ? pingPongMode(target, config, &spec) : 0,
                    gpu.kvSplits,
                    geo.ringStages && !gpu.kvSplits &&
                            usesPersistentKernel(target, config)
                        ? "true"
                        : "false",
                    gpu.tensorMaps ? "true" : "false", gpu.tensorMaps,
                    gpu.tileSchedule ? "true" : "false");
  }
  if (o.json) {
    fmt::print(
        "{{\"spec\":{},\"config\":{},\"problem\":{},\"device\":\"{}\","
        "\"rel_err\":{:.6e},\"o_rel_err\":{:.6e},\"lse_rel_err\":{:.6e},"
        "\"nan_count\":{},\"lse_mismatch\":{},\"bound\":{},\"ok\":{},"
        "\"rows_checked\":{},\"time_ms\":{:.4f},\"compile_ms\":{:.3f},"
        "\"input_seed\":{},\"layout_seed\":{},\"density\":{}{}{}}}\n",
        spec.toJson(), config.toJson(), p.toJson(spec), deviceName, reported,
        err.oRelErr, err.lseRelErr, err.nanCount, err.lseMismatch, bound,
        ok ? "true" : "false", rowsChecked, runMs, compileMs, inputSeed,
        spec.blockSparse && o.layoutPath.empty() ? std::to_string(layoutSeed)
                                                 : "null",
        layout ? fmt::format("{:.4f}", layout->density()) : "null",
        gpuFields + (blocks ? maskBlocksJson(*blocks) : ""), seqLensJson(o));
  } else {
    fmt::print("{} on {}: rel_err {:.3e} (O {:.3e}, lse {:.3e}, bound {}, "
               "{} rows checked) -> {}\n",
               spec.name(), deviceName, reported, err.oRelErr, err.lseRelErr,
               bound, rowsChecked, ok ? "ok" : "FAILED");
    fmt::print("compile {:.1f} ms, run {:.3f} ms (Br {} x Bc {}, {} warps)",
               compileMs, runMs, config.blockM, config.blockN, config.warps);
    if (device == Device::Cuda)
      fmt::print("{}", gpuTextSummary(gpu, tflops));
    fmt::print("\n");
    if (blocks)
      fmt::print("{}", maskBlocksText(*blocks));
  }
  if (!ok && !o.source.empty())
    fmt::print(stderr,
               "flashjit: {} does not compute the attention its description "
               "names ({}): rel_err {:.3e} >= {} against its float64 "
               "reference; an edit that changes the arithmetic fails this "
               "check\n",
               o.source.name, spec.name(), reported, bound);
  return ok ? Ok : AccuracyFailed;
}

int dispatch(int argc, const char *const *argv) {
  CliOptions o = parseCommandLine(argc, argv);
  if (o.version) {
    fmt::print("{}", versionText());
    return Ok;
  }
  if (o.help || o.command.empty() || o.command == "help") {
    fmt::print("{}", helpText(o.command == "help" ? "" : o.command));
    return o.command.empty() && !o.help ? Usage : Ok;
  }
  if (o.command == "compile")
    return runCompile(o);
  if (o.command == "cache")
    return runCacheCommand(o);
  // An unusable --dump-io is found before the run, not after it.
  if (!o.dumpDir.empty() && o.command == "run")
    prepareDumpDirectory(o.dumpDir);
  if (o.spec.direction == Direction::Backward)
    return runBackward(o);
  return runRun(o);
}

} // namespace
} // namespace flashjit::cli

/// Flushes stdout: a failed write (a full disk, a closed pipe) is an error
/// (exit 2 with a message), not a silent success.
static int checkStdout(int code) {
  if (std::fflush(stdout) == 0 && !std::ferror(stdout))
    return code;
  int err = errno;
  std::fprintf(stderr, "flashjit: error: cannot write to standard output: %s\n",
               std::strerror(err ? err : EIO));
  return flashjit::cli::Usage;
}

/// The whole CLI: returns the process exit code. Never throws.
extern "C" __attribute__((visibility("default"))) int
flashjit_cli_main(int argc, const char *const *argv) {
  using namespace flashjit;
  try {
    return checkStdout(cli::dispatch(argc, argv));
  } catch (const SpecError &e) {
    fmt::print(stderr, "flashjit: error: {}\n", e.what());
    return cli::Usage;
  } catch (const CompileError &e) {
    fmt::print(stderr, "flashjit: error: {}\n", e.what());
    return cli::Usage;
  } catch (const rt::RuntimeError &e) {
    fmt::print(stderr, "flashjit: error: {}\n", e.what());
    return e.code() == rt::ErrorCode::NoDriver ? cli::NoDriver : cli::Usage;
  } catch (const std::bad_alloc &) {
    fmt::print(stderr, "flashjit: error: out of host memory: this problem's "
                       "buffers do not fit (reduce --batch, --heads or "
                       "--seq-len)\n");
    return cli::Usage;
  } catch (const std::filesystem::filesystem_error &e) {
    fmt::print(stderr, "flashjit: error: {}\n", e.what());
    return cli::Usage;
  } catch (const std::exception &e) {
    fmt::print(stderr, "flashjit: internal error: {}\n", e.what());
    return cli::Internal;
  }
}
