//===- CliOptions.cpp - flashjit's command-line options -------------------===//

#include "tools/cli/CliOptions.h"
#include "kernels/GpuDefaults.h"
#include "kernels/GpuGeometry.h"
#include "kernels/HostTensor.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fmt/format.h>
#include <functional>
#include <map>
#include <random>
#include <set>

namespace flashjit::cli {

static const char *kCommands[] = {"compile", "run",   "bench",
                                  "tune",    "cache", "help"};

TileConfig withTilingSwitches(TileConfig base, const TileConfig &given) {
  base.overlapSoftmax |= given.overlapSoftmax;
  base.persistent |= given.persistent;
  base.queryByTensorMap |= given.queryByTensorMap;
  base.outputByTensorMap |= given.outputByTensorMap;
  return base;
}

std::optional<TileConfig> flagTiling(const CliOptions &o,
                                     const TileConfig &deviceDefault) {
  if (!o.configFromFlags)
    return std::nullopt;
  return o.tilingSwitchesOnly ? withTilingSwitches(deviceDefault, o.config)
                              : o.config;
}

const std::vector<std::string> &runOnlyOptions() {
  static const std::vector<std::string> options = {
      "--batch",      "--heads",   "--seq-len",   "--seq-len-kv", "--scale",
      "--device",     "--repeats", "--seed",      "--tune",       "--dump-io",
      "--packed-qkv", "--capture", "--seqlens-q", "--seqlens-kv", "--cold-l2"};
  return options;
}

namespace {

int64_t parseInt(const std::string &flag, const std::string &text) {
  char *end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    throw SpecError(
        fmt::format("{}: expected an integer, got '{}'", flag, text));
  return v;
}

double parseDouble(const std::string &flag, const std::string &text) {
  char *end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0')
    throw SpecError(fmt::format("{}: expected a number, got '{}'", flag, text));
  // ERANGE: an overflow (HUGE_VAL) is refused here; an underflow (a denormal
  // or 0) is a number, which the flag's own range check names.
  if (errno == ERANGE && std::isinf(v))
    throw SpecError(
        fmt::format("{}: '{}' is out of the range of a double (|x| < 1.8e308)",
                    flag, text));
  return v;
}

} // namespace

/// --score-mod's \p value into \p spec: a named variant ("softcap:30"),
/// a region's text ("{ ^bb0(...): ... }") or "@FILE", a file that holds
/// one (at most 64 KiB).
static void applyScoreMod(AttentionSpec &spec, const std::string &value) {
  std::string text = value;
  if (!text.empty() && text[0] == '@') {
    text = readBoundedFile(text.substr(1), "--score-mod", 1 << 16);
    if (text.find_first_not_of(" \t\r\n") == std::string::npos)
      throw SpecError(fmt::format("--score-mod {}: the file is empty", value));
  }
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{')
    spec = withScoreModRegion(spec, text);
  else
    spec.scoreMod = ScoreMod::parse(text).name();
}

CliOptions parseCommandLine(int argc, const char *const *argv) {
  CliOptions o;
  std::vector<std::string> args(argv + 1, argv + argc);
  size_t i = 0;
  if (!args.empty() && args[0].rfind("-", 0) != 0) {
    o.command = args[0];
    ++i;
    bool known = false;
    for (const char *c : kCommands)
      known |= o.command == c;
    if (!known)
      throw SpecError(fmt::format(
          "unknown command '{}' (expected compile, run, bench, tune, cache "
          "or help)",
          o.command));
    if (o.command == "cache") {
      if (i >= args.size() || args[i].rfind("-", 0) == 0)
        throw SpecError("cache: give an action: list, clear or path");
      o.cacheVerb = args[i++];
    }
  }
  bool headDimVGiven = false, seqKVGiven = false, headsGiven = false;
  bool batchOrLengthGiven = false; ///< --batch, --seq-len or --seq-len-kv
  // --score-mod's value, applied to the whole description at the end.
  std::optional<std::string> scoreModArg, maskModArg;
  bool blockMGiven = false, blockNGiven = false, warpsGiven = false;
  bool numbersGiven = false; // --block-m/-n, --warps, --stages, --kv-splits
  std::optional<std::string> window;

  using Handler = std::function<void(const std::string &)>;
  std::map<std::string, Handler> withValue = {
      {"--head-dim",
       [&](auto &v) { o.spec.headDimQK = parseInt("--head-dim", v); }},
      {"--head-dim-v",
       [&](auto &v) {
         o.spec.headDimV = parseInt("--head-dim-v", v);
         headDimVGiven = true;
       }},
      {"--dtype",
       [&](auto &v) {
         if (v == "bf16")
           o.spec.dtype = DType::BF16;
         else if (v == "fp16" || v == "f16")
           o.spec.dtype = DType::FP16;
         else
           throw SpecError(
               fmt::format("--dtype: expected bf16 or fp16, got '{}'", v));
       }},
      {"--window", [&](auto &v) { window = v; }},
      {"--gqa", [&](auto &v) { o.spec.gqaGroup = parseInt("--gqa", v); }},
      {"--block-sparse",
       [&](auto &v) { o.density = parseDouble("--block-sparse", v); }},
      {"--layout", [&](auto &v) { o.layoutPath = v; }},
      {"--input", [&](auto &v) { o.inputPath = v; }},
      {"--sparse-block",
       [&](auto &v) { o.spec.sparseBlock = parseInt("--sparse-block", v); }},
      {"--batch",
       [&](auto &v) {
         o.problem.batch = parseInt("--batch", v);
         batchOrLengthGiven = true;
       }},
      {"--heads",
       [&](auto &v) {
         o.problem.heads = parseInt("--heads", v);
         headsGiven = true;
       }},
      {"--seq-len",
       [&](auto &v) {
         o.problem.seqLenQ = parseInt("--seq-len", v);
         batchOrLengthGiven = true;
       }},
      {"--seq-len-kv",
       [&](auto &v) {
         o.problem.seqLenKV = parseInt("--seq-len-kv", v);
         seqKVGiven = batchOrLengthGiven = true;
       }},
      {"--scale",
       [&](auto &v) { o.problem.scale = parseDouble("--scale", v); }},
      {"--block-m",
       [&](auto &v) {
         o.config.blockM = parseInt("--block-m", v);
         blockMGiven = numbersGiven = true;
       }},
      {"--block-n",
       [&](auto &v) {
         o.config.blockN = parseInt("--block-n", v);
         blockNGiven = numbersGiven = true;
       }},
      {"--device",
       [&](auto &v) {
         if (v == "cpu")
           o.device = Device::Cpu;
         else if (v == "cuda")
           o.device = Device::Cuda;
         else
           throw SpecError(
               fmt::format("--device: expected cpu or cuda, got '{}'", v));
       }},
      {"--emit", [&](auto &v) { o.emit = v; }},
      {"--target", [&](auto &v) { o.target = v; }},
      {"--warps",
       [&](auto &v) {
         o.config.warps = parseInt("--warps", v);
         warpsGiven = numbersGiven = true;
       }},
      {"--stages",
       [&](auto &v) {
         o.config.stages = parseInt("--stages", v);
         warpsGiven = numbersGiven = true; // the config comes from flags
       }},
      {"--kv-splits",
       [&](auto &v) {
         o.config.splits =
             v == "auto" ? TileConfig::kAutoSplits : parseInt("--kv-splits", v);
         if (o.config.splits == TileConfig::kAutoSplits && v != "auto")
           throw SpecError(
               fmt::format("--kv-splits: expected auto, 0 or 1..{}, got {}",
                           TileConfig::kMaxSplits, v));
         warpsGiven = numbersGiven = true;
       }},
      {"--repeats", [&](auto &v) { o.repeats = parseInt("--repeats", v); }},
      {"--score-mod", [&](auto &v) { scoreModArg = v; }},
      {"--mask-mod", [&](auto &v) { maskModArg = v; }},
      {"-o", [&](auto &v) { o.outputPath = v; }},
      {"--dump-io", [&](auto &v) { o.dumpDir = v; }},
      {"--capture", [&](auto &v) { o.captureFiles.push_back(v); }},
      {"--seed",
       [&](auto &v) {
         o.seed = uint64_t(parseInt("--seed", v));
         o.seedGiven = true;
       }},
      {"--seqlens-q",
       [&](auto &v) { o.seqLensQ = parseLengths("--seqlens-q", v); }},
      {"--seqlens-kv",
       [&](auto &v) { o.seqLensKV = parseLengths("--seqlens-kv", v); }},
  };
  std::map<std::string, std::function<void()>> flags = {
      {"--causal", [&] { o.spec.mask = MaskKind::Causal; }},
      {"--backward", [&] { o.spec.direction = Direction::Backward; }},
      {"--deterministic", [&] { o.spec.deterministic = true; }},
      {"--varlen", [&] { o.spec.varlen = true; }},
      {"--mask-blocks", [&] { o.maskBlocks = true; }},
      {"--json", [&] { o.json = true; }},
      {"--cold-l2", [&] { o.coldL2 = true; }},
      {"--packed-qkv", [&] { o.packedQKV = true; }},
      {"--tune", [&] { o.tune = true; }},
      {"--overlap-softmax",
       [&] {
         o.config.overlapSoftmax = true;
         warpsGiven = true; // a tiling flag: the config comes from flags
       }},
      {"--persistent",
       [&] {
         o.config.persistent = true;
         warpsGiven = true;
       }},
      {"--query-tma",
       [&] {
         o.config.queryByTensorMap = true;
         warpsGiven = true;
       }},
      {"--output-tma",
       [&] {
         o.config.queryByTensorMap = o.config.outputByTensorMap = true;
         warpsGiven = true;
       }},
      {"--help", [&] { o.help = true; }},
      {"-h", [&] { o.help = true; }},
      {"--version", [&] { o.version = true; }},
  };

  // The flags that describe the kernel: with --input the file does.
  static const std::set<std::string> kSpecFlags = {
      "--head-dim",  "--head-dim-v", "--dtype",         "--gqa",
      "--causal",    "--backward",   "--deterministic", "--sparse-block",
      "--score-mod", "--varlen",     "--mask-mod",      "--mask-blocks"};
  std::vector<std::string> specFlagsSeen, runFlagsSeen;
  const std::vector<std::string> &runOnly = runOnlyOptions();
  for (; i < args.size(); ++i) {
    std::string arg = args[i], value;
    if (std::find(runOnly.begin(), runOnly.end(),
                  arg.substr(0, arg.find('='))) != runOnly.end())
      runFlagsSeen.push_back(arg.substr(0, arg.find('=')));
    if (kSpecFlags.count(arg.substr(0, arg.find('='))))
      specFlagsSeen.push_back(arg.substr(0, arg.find('=')));
    bool inlineValue = false;
    if (auto eq = arg.find('=');
        arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inlineValue = true;
    }
    if (auto f = flags.find(arg); f != flags.end() && !inlineValue) {
      f->second();
      continue;
    }
    auto h = withValue.find(arg);
    if (h == withValue.end())
      throw SpecError(fmt::format("unknown option '{}' (see --help)", arg));
    if (!inlineValue) {
      if (i + 1 >= args.size())
        throw SpecError(fmt::format("{} needs a value", arg));
      value = args[++i];
    }
    h->second(value);
  }
  if (o.help || o.version)
    return o;
  if (o.command == "compile" && !runFlagsSeen.empty())
    throw SpecError(fmt::format(
        "compile: {} is an option of run, bench and tune (the problem, the "
        "inputs or the timing); a compiled kernel serves every problem: drop "
        "it",
        runFlagsSeen.front()));

  if (o.coldL2 && o.command != "run" && o.command != "bench")
    throw SpecError(fmt::format(
        "{}: --cold-l2 is an option of run and bench (how they time their "
        "launches); tune times its candidates as they are",
        o.command));

  if (!headDimVGiven)
    o.spec.headDimV = o.spec.headDimQK;
  if (scoreModArg)
    applyScoreMod(o.spec, *scoreModArg);
  if (maskModArg)
    applyMaskMod(*maskModArg, o, window);
  // The backward of a score_mod that captures tensors also gives their
  // gradients (atomic adds; summed in fixed point with --deterministic),
  // checked with dQ, dK and dV; a mask_mod's captured tensors take none.
  if (o.spec.direction == Direction::Backward &&
      o.spec.captures > o.spec.maskCaptures)
    o.spec.captureGrads =
        (int64_t(1) << (o.spec.captures - o.spec.maskCaptures)) - 1;
  std::optional<TileConfig> fileTiling;
  if (!o.inputPath.empty()) {
    if (o.command != "compile" && o.command != "run" && o.command != "bench")
      throw SpecError("--input works with compile, run and bench");
    if (o.tune)
      throw SpecError("--input: a kernel read from a file is not tuned "
                      "(give its tiling with --warps)");
    if (!specFlagsSeen.empty())
      throw SpecError(fmt::format("--input {}: the file carries the "
                                  "description; drop {}",
                                  o.inputPath, specFlagsSeen.front()));
    o.source.name = o.inputPath;
    o.source.text = readBoundedFile(o.inputPath, "--input", 64 << 20);
    if (o.source.text.empty())
      throw SpecError(
          fmt::format("--input {}: the file is empty", o.inputPath));
    SourceInfo info;
    try {
      info = inspectSource(o.source);
    } catch (const CompileError &e) {
      throw SpecError(e.what());
    }
    const bool wantSparse =
        o.density.has_value() || !o.layoutPath.empty() || o.maskBlocks;
    if (info.spec.blockSparse && !wantSparse)
      throw SpecError(fmt::format("--input {}: the kernel is block-sparse; "
                                  "give --block-sparse DENSITY or --layout "
                                  "FILE",
                                  o.source.name));
    if (!info.spec.blockSparse && wantSparse)
      throw SpecError(fmt::format("--input {}: the kernel is dense; drop "
                                  "--block-sparse / --layout",
                                  o.source.name));
    if (window && info.spec.mask != MaskKind::SlidingWindow)
      throw SpecError(fmt::format("--input {}: --window needs a "
                                  "sliding_window kernel",
                                  o.source.name));
    if (!window && info.spec.mask == MaskKind::SlidingWindow)
      throw SpecError(fmt::format("--input {}: the kernel has a sliding "
                                  "window; give its sizes with --window L,R",
                                  o.source.name));
    o.spec = info.spec;
    // A backward description whose region is no named variant: its forward
    // (O and lse) is the same description as attn.flash_fwd.
    if (o.spec.direction == Direction::Backward &&
        o.spec.scoreMod == kCustomScoreMod)
      o.forwardSource = forwardSourceOf(o.source);
    fileTiling = info.tiling;
    if (fileTiling && ((blockMGiven && o.config.blockM != fileTiling->blockM) ||
                       (blockNGiven && o.config.blockN != fileTiling->blockN)))
      throw SpecError(fmt::format(
          "--input {}: the file is tiled {} x {}; drop --block-m / --block-n",
          o.source.name, fileTiling->blockM, fileTiling->blockN));
  }
  if (!seqKVGiven)
    o.problem.seqLenKV = o.problem.seqLenQ;
  if (!headsGiven) {
    // One KV head by default; alibi:H's H heads (its slopes are theirs).
    ScoreMod mod = ScoreMod::of(o.spec);
    o.problem.heads =
        mod.kind == ScoreMod::Kind::Alibi ? mod.heads : o.spec.gqaGroup;
  }
  if (window) {
    if (o.spec.mask == MaskKind::Causal)
      throw SpecError("--causal and --window are exclusive (causal is "
                      "--window inf,0)");
    auto comma = window->find(',');
    if (comma == std::string::npos)
      throw SpecError(fmt::format("--window: expected L,R, got '{}'", *window));
    o.spec.mask = MaskKind::SlidingWindow;
    o.problem.windowLeft = parseInt("--window", window->substr(0, comma));
    o.problem.windowRight = parseInt("--window", window->substr(comma + 1));
  }
  if (o.density && !o.layoutPath.empty())
    throw SpecError("--block-sparse and --layout are exclusive");
  applyVarlenOptions(o, batchOrLengthGiven);
  if (o.source.empty())
    o.spec.blockSparse = o.density.has_value() || !o.layoutPath.empty();
  applyMaskBlocks(o);
  if (o.spec.deterministic && o.spec.direction != Direction::Backward)
    throw SpecError("--deterministic needs --backward (it chooses how the "
                    "backward sums dQ)");
  o.spec.validate();
  // Unset tiling knobs take the default GPU tiling for this head dim (the
  // backward's own for --backward).
  const bool backward = o.spec.direction == Direction::Backward;
  TileConfig heuristic =
      backward ? defaultGpuBackwardConfig(o.spec) : defaultGpuConfig(o.spec);
  if (!blockMGiven)
    o.config.blockM = fileTiling ? fileTiling->blockM : heuristic.blockM;
  if (!blockNGiven)
    o.config.blockN = fileTiling ? fileTiling->blockN : heuristic.blockN;
  o.configFromFlags = blockMGiven || blockNGiven || warpsGiven;
  o.tilingSwitchesOnly = o.configFromFlags && !numbersGiven;
  // Warps split Br (and, in the backward's dK/dV kernel, Bc) in 16-row
  // tiles; with atomic dQ the backward's warps split only Bc.
  const bool atomicDq = backward && !o.spec.deterministic;
  int64_t splitRows = atomicDq   ? o.config.blockN
                      : backward ? std::min(o.config.blockM, o.config.blockN)
                                 : o.config.blockM;
  if (!warpsGiven)
    o.config.warps =
        std::min(heuristic.warps, std::max<int64_t>(1, splitRows / 16));
  if (o.packedQKV &&
      (o.spec.headDimQK != o.spec.headDimV || o.spec.gqaGroup != 1 ||
       o.problem.seqLenQ != o.problem.seqLenKV))
    throw SpecError("--packed-qkv needs head_dim_qk == head_dim_v, gqa 1 and "
                    "seq_len == seq_len_kv");
  if (o.repeats < 1)
    throw SpecError(fmt::format("--repeats must be >= 1, got {}", o.repeats));
  o.config.validate(o.spec);
  if (o.command != "compile") { // compile needs no problem
    o.problem.validate(o.spec);
    checkProblemSize(o.spec, o.problem);
  }
  return o;
}

} // namespace flashjit::cli
