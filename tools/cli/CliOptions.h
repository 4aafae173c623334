//===- CliOptions.h - flashjit's command-line options -----------*- C++ -*-===//
//
/// \file
/// Parsing of the flags every flashjit command shares (the spec, the problem,
/// the tiling, the device, the output). Plain C++: bad input becomes a
/// SpecError, which the CLI prints on one line before exiting with 2.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_TOOLS_CLI_CLIOPTIONS_H
#define FLASHJIT_TOOLS_CLI_CLIOPTIONS_H

#include "compiler/Compiler.h"
#include "kernels/AttentionSpec.h"
#include "kernels/HostTensor.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flashjit::cli {

enum class Device { Cpu, Cuda };

struct CliOptions {
  std::string command;
  AttentionSpec spec;
  Problem problem;
  TileConfig config;
  std::optional<Device> device; ///< unset: cuda when a GPU is found, else cpu
  std::string emit = "tile";
  std::string target;   ///< --target: sm_80, sm_90a, ... (default: the GPU's)
  int64_t repeats = 20; ///< timed launches (median reported)
  /// --cold-l2: each timed launch behind a zeroing of twice the L2
  /// (engine::timeLaunches), as triton's do_bench times.
  bool coldL2 = false;
  std::string outputPath;
  std::string dumpDir;
  std::string layoutPath;
  /// --capture FILE.npy, repeated: the score modifier's captured tensors.
  std::vector<std::string> captureFiles;
  /// --input FILE: the IR to compile or run (the attn or the tile stage,
  /// e.g. an edited `--emit tile`); the spec (and, for the tile stage, Br x
  /// Bc) are the file's.
  KernelSource source;
  /// With a backward --input whose score_mod is a custom region: the
  /// forward of the same description (forwardSourceOf), else empty.
  KernelSource forwardSource;
  std::string inputPath; ///< --input FILE as given
  std::optional<double> density;
  uint64_t seed = 0;
  bool seedGiven = false;
  bool json = false;
  bool configFromFlags = false; ///< any of --block-m, --block-n, --warps
  /// Only the tiling's switches were given (--overlap-softmax,
  /// --persistent, --query-tma, --output-tma; no --block-m, --block-n,
  /// --warps, --stages or --kv-splits): on the GPU they switch the
  /// device's own default tiling (withTilingSwitches), not the generic one.
  bool tilingSwitchesOnly = false;
  bool tune = false;            ///< --tune: tune before running
  std::string cacheVerb;        ///< `flashjit cache VERB`
  bool packedQKV = false; ///< q, k, v as views of one (B, N, 3, H, d) buffer
  /// --seqlens-q / --seqlens-kv: a variable-length batch's sequences
  /// (AttentionSpec::varlen), one length each.
  std::vector<int64_t> seqLensQ, seqLensKV;
  /// --mask-blocks: the block-sparse layout of the --mask-mod region,
  /// classified by the kernel's `@f_blocks` on the run's device.
  bool maskBlocks = false;
  bool help = false;
  bool version = false; ///< --version: the versions of flashjit and its
                        ///< libraries (never fails)
};

/// Parses argv[1..]; throws SpecError on an unknown flag or a bad value.
CliOptions parseCommandLine(int argc, const char *const *argv);

/// The block-sparse layout the options describe (nullptr when dense), its
/// fit to the problem checked; random layouts come from \p seed.
std::unique_ptr<BlockSparseLayout> layoutFromOptions(const CliOptions &o,
                                                     uint64_t seed);

/// The random inputs of a `run`: fresh every time (the seeds are reported
/// so that a failure can be replayed), the layout from --seed if given.
struct RandomRun {
  uint64_t layoutSeed = 0, inputSeed = 0;
  std::unique_ptr<BlockSparseLayout> layout;
  AttentionData data;
};
RandomRun makeRandomRun(const CliOptions &o, const AttentionSpec &forwardSpec);

/// `--mask-mod M` (MaskMods.cpp): causal and sliding_window:L,R set the
/// description's mask (\p window takes L,R as --window's); document, a
/// region's text or @FILE set its mask_mod region (after the score
/// modifier: its captured tensors come after the score_mod's); a
/// SpecError for an unknown name, a bad region or a clash with --window
/// or --causal.
void applyMaskMod(const std::string &name, CliOptions &o,
                  std::optional<std::string> &window);

/// `--mask-blocks` (MaskMods.cpp), after the description is complete: the
/// description becomes block-sparse, its layout classified from the
/// mask_mod region at run time; a SpecError without a mask_mod region,
/// with --block-sparse / --layout, or with a variable-length batch.
void applyMaskBlocks(CliOptions &o);

/// ",\"seqlens_q\":[...],\"seqlens_kv\":[...]" of a varlen run (its
/// sequences' lengths, for `run --json`), "" otherwise.
std::string seqLensJson(const CliOptions &o);

/// "L1,L2,..." of \p flag: one or more lengths, each in [0, 2^24], their
/// sum below 2^31 (the kernels' int32 offsets).
std::vector<int64_t> parseLengths(const std::string &flag,
                                  const std::string &text);

/// --seqlens-q / --seqlens-kv and --varlen: the variable-length batch's
/// spec and problem (B and the longest sequences), or a SpecError for a
/// combination that cannot run (\p batchOrLengthGiven: --batch, --seq-len
/// or --seq-len-kv was given too).
void applyVarlenOptions(CliOptions &o, bool batchOrLengthGiven);

/// The options only `run`, `bench` and `tune` use (the problem, the
/// random inputs, the device, the timing), which `compile` refuses.
const std::vector<std::string> &runOnlyOptions();

/// \p base with the switches that \p given sets (the overlapped loop, the
/// persistent kernel, Q and O by their tensor maps) turned on.
TileConfig withTilingSwitches(TileConfig base, const TileConfig &given);

/// The tiling \p o's flags give on the GPU, whose own default is
/// \p deviceDefault: none without tiling flags; \p deviceDefault with the
/// switches on where only switches were given (tilingSwitchesOnly); else
/// the flags' config.
std::optional<TileConfig> flagTiling(const CliOptions &o,
                                     const TileConfig &deviceDefault);

/// The --help text of \p command ("" for the top level).
std::string helpText(const std::string &command);

} // namespace flashjit::cli

#endif // FLASHJIT_TOOLS_CLI_CLIOPTIONS_H
