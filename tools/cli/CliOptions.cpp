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

std::string helpText(const std::string &command) {
  std::string usage;
  if (command == "compile")
    usage =
        "usage: flashjit compile [spec | --input FILE] [tiling] [--emit STAGE]"
        " [-o FILE]\n"
        "Prints one stage of the pipeline for the described attention.\n"
        "  --emit STAGE         attn | tile | gpu | llvm | ptx | cubin |\n"
        "                       cpu-llvm (default: tile; 'tiled' is its old\n"
        "                       name); cubin needs -o\n"
        "  --input FILE         continue from the IR in FILE (the attn or the\n"
        "                       tile stage, edited or not): its description\n"
        "                       and tiling are the kernel's\n"
        "  --target ARCH        sm_80, sm_86, sm_89, sm_90, sm_90a, ...\n"
        "                       (default: the GPU found, else sm_90a)\n"
        "  -o FILE              write the stage to FILE instead of stdout\n"
        "The problem (--batch, --heads, --seq-len, --seq-len-kv, --scale) and\n"
        "run's --device, --repeats, --seed, --tune, --dump-io, --packed-qkv\n"
        "are refused: a compiled kernel serves every problem.\n";
  else if (command == "tune")
    usage = "usage: flashjit tune [spec] [problem] [--json]\n"
            "Tunes Br x Bc and warps on the GPU for this spec and problem\n"
            "class (sequence lengths and batch*heads rounded up to powers of\n"
            "two): compiles the candidates the device allows in parallel,\n"
            "times each, prints the table and the winner, and stores it in\n"
            "the cache (later runs and benches use it). Then runs the winner\n"
            "against the reference. With --backward: tunes the backward\n"
            "(stored apart from the forward's).\n";
  else if (command == "cache")
    usage =
        "usage: flashjit cache list|clear|path\n"
        "The on-disk cache of cubins and tuning results: FLASHJIT_CACHE_DIR,\n"
        "else $XDG_CACHE_HOME/flashjit, else ~/.cache/flashjit.\n";
  else if (command == "bench")
    usage =
        "usage: flashjit bench [spec] [problem] [tiling] [--json]\n"
        "Times the kernel on the GPU: CUDA events, warm-up, median of\n"
        "--repeats launches (default 20); TFLOP/s = 4*B*H*Nq*Nkv*d\n"
        "(halved for causal) / time; checks a sample of rows. With\n"
        "--backward: times the backward alone (after one forward), FLOPs\n"
        "2.5x the forward's.\n"
        "  --cold-l2            zero twice the L2 before each timed launch\n"
        "                       (a cold L2, and the GPU busy while the\n"
        "                       host enqueues: no launch latency in the\n"
        "                       time, as triton's do_bench times)\n";
  else if (command == "run")
    usage =
        "usage: flashjit run [spec | --input FILE] [problem] [tiling] "
        "[--device D] [--json] [--dump-io DIR]\n"
        "Runs the kernel on fresh random inputs and checks it against a\n"
        "float64 reference (relative norm error of O and lse).\n"
        "  --input FILE         run the IR in FILE (attn or tile stage),\n"
        "                       checked against the float64 reference of the\n"
        "                       attention its description names: an edit\n"
        "                       that changes the arithmetic fails (exit 1)\n"
        "  --device cpu|cuda    where to run (default: cuda when a GPU is\n"
        "                       found, else cpu with a note on stderr)\n"
        "  --json               one JSON object on stdout, logs on stderr\n"
        "  --dump-io DIR        write q, k, v, o, lse (and the layout) as "
        ".npy\n"
        "  --seed N             seed of the random inputs and block-sparse\n"
        "                       layout (default: fresh every run)\n"
        "  --tune               tune the tiling first (as `flashjit tune`)\n"
        "  --packed-qkv         q, k, v as strided views of one\n"
        "                       (B, N, 3, H, d) buffer\n"
        "  --capture FILE.npy   a captured tensor of the score modifier's\n"
        "                       region, once per tensor in its order\n"
        "                       (float32/64 or int32/64, read as float32);\n"
        "                       with --backward its gradient is checked too\n"
        "exit codes: 0 ok, 1 accuracy check failed, 2 usage or bad input\n"
        "            (a named error on stderr), 3 no CUDA driver, 4 internal\n"
        "            error (a bug in flashjit: please report it)\n";
  else
    usage =
        "usage: flashjit <command> [options]\n"
        "flashjit JIT-compiles FlashAttention-style kernels through an "
        "MLIR pipeline.\n"
        "commands:\n"
        "  compile   print a stage of the pipeline (attn, tile, gpu, llvm,\n"
        "            ptx, cubin, cpu-llvm)\n"
        "  run       run on random inputs and check against a reference\n"
        "  bench     time the kernel on the GPU (TFLOP/s)\n"
        "  tune      tune Br x Bc, warps on the GPU and cache the winner\n"
        "  cache     list, clear or locate the on-disk cache\n"
        "  help      this text; `flashjit <command> --help` for more\n"
        "  --version flashjit's version, LLVM/MLIR's, and those of the CUDA\n"
        "            driver and nvJitLink when found (both are loaded at run\n"
        "            time)\n";
  return usage +
         "spec:\n"
         "  --head-dim D         head dim of Q and K (and V unless "
         "--head-dim-v), 1..512\n"
         "  --head-dim-v DV      head dim of V and O, 1..512\n"
         "  --dtype bf16|fp16    element type (default bf16)\n"
         "  --causal             causal mask (bottom-right aligned)\n"
         "  --window L,R         sliding window: key j visible from query i "
         "iff\n"
         "                       i+Nkv-Nq-L <= j <= i+Nkv-Nq+R\n"
         "  --gqa G              query heads per KV head (default 1)\n"
         "  --block-sparse DENS  random block-sparse layout of that density\n"
         "  --layout FILE        block-sparse layout: one line per sparse Q "
         "block,\n"
         "                       0/1 per sparse KV block (broadcast over B, "
         "H);\n"
         "                       2: listed and full (--mask-mod keeps all\n"
         "                       its elements: the mask is not evaluated)\n"
         "  --mask-blocks        the layout of --mask-mod's region, found by\n"
         "                       the kernel on the run's device\n"
         "  --sparse-block S     sparse block size (default 128)\n"
         "  --mask-mod M         causal, sliding_window:L,R (as --causal,\n"
         "                       --window L,R); document: key j visible\n"
         "                       from query i iff seg[i] == seg[j], seg from\n"
         "                       --capture FILE.npy; or a mask_mod region's\n"
         "                       text {...} / @FILE ((%b, %h, %i, %j: index)\n"
         "                       -> i1; false masks the score); with\n"
         "                       --score-mod, its captures come after that\n"
         "                       region's\n"
         "  --varlen             variable-length packing: the sequences one\n"
         "                       after another, (total, H, d), with i32\n"
         "                       offsets (implied by --seqlens-q)\n"
         "  --backward           the backward pass (dQ, dK, dV): `run` runs\n"
         "                       the forward, then the backward on random dO,\n"
         "                       and checks the three gradients (--dump-io\n"
         "                       adds do, dq, dk, dv); `bench` and `tune`\n"
         "                       time / tune the backward alone (GPU);\n"
         "                       `compile` emits any stage of it\n"
         "  --deterministic      with --backward: dQ by a separate pass over\n"
         "                       Q blocks and captured tensors' gradients in\n"
         "                       64-bit fixed point, bit-identical run to run\n"
         "                       (default: atomic adds in f32, faster)\n"
         "  --score-mod MOD      score modifier, applied to the scaled\n"
         "                       score s of query i and key j in query head\n"
         "                       h before the mask and the softmax (with\n"
         "                       --backward, its derivative carries dS\n"
         "                       back to s):\n"
         "                       softcap:C  C * tanh(s / C), C > 0\n"
         "                       alibi:H    s + 2^(-8 (h + 1) / H) * (j - i),\n"
         "                                  H = --heads, in [1, 2^20]\n"
         "                       {...}      a score_mod region's text, as\n"
         "                                  --emit attn prints one (arith\n"
         "                                  and math ops on (%s: f32, %b,\n"
         "                                  %h, %i, %j: index))\n"
         "                       @FILE      such a region from FILE\n"
         "problem:\n"
         "  --batch B --heads H --seq-len N --seq-len-kv M (default M = N,\n"
         "                       H = the gqa group size: one KV head, or\n"
         "                       alibi:H's H)\n"
         "  --seqlens-q L1,L2,.. a variable-length batch (--varlen): one\n"
         "                       query length per sequence (0 allowed);\n"
         "  --seqlens-kv M1,..   its key lengths (default the query ones);\n"
         "                       replaces --batch / --seq-len / --seq-len-kv\n"
         "  --scale S            softmax scale (default 1/sqrt(head dim))\n"
         "tiling:\n"
         "  --block-m BR --block-n BC --warps W --stages S (default on the "
         "GPU: the\n"
         "                       tuned config if `flashjit tune` stored one\n"
         "                       for this GPU and problem class, else by\n"
         "                       head dim and GPU, e.g. 128 x 64 with 4\n"
         "                       warps (on sm_90a the warpgroup tiles, e.g.\n"
         "                       128 x 128 with 8 warps, the K/V ring and\n"
         "                       --overlap-softmax at d = 128;\n"
         "                       `compile` shows the first unless given);\n"
         "                       --backward: `tune --backward`'s config, else\n"
         "                       64 x 128 with 8 warps up to d = 128 (128 x\n"
         "                       128 at d <= 64 without a mask), 64 x 64 with\n"
         "                       4 up to 256, 32 x 32 with 2 past it;\n"
         "                       --deterministic: 64 x 64 with 4 warps (128 x\n"
         "                       64 at d <= 64 without a mask) up to 256)\n"
         "                       --stages: 2 (K and V of one block in\n"
         "                       flight); on sm_90a the K/V ring's depth\n"
         "                       for tilings of 8 or 12 warps up to d = 256\n"
         "                       (2..4; 1: no ring; FLASHJIT_KV_RING=0:\n"
         "                       none)\n"
         "  --kv-splits S|auto   split-KV (FlashDecoding): S partials per\n"
         "                       row block over runs of the keys, then\n"
         "                       their lse merge; the query heads of a KV\n"
         "                       head share its tiles (gqa > 1, dense).\n"
         "                       auto: S from the SM count and the problem\n"
         "                       at launch. Default 0 (one pass), except on\n"
         "                       the GPU for decode: Nq * gqa <= 64 query\n"
         "                       rows per KV head and Nkv >= 1024\n"
         "  --overlap-softmax    the software-pipelined KV loop: S = Q K^T of\n"
         "                       block t + 1 is issued before the softmax of\n"
         "                       block t (forward; on sm_90a the K/V ring's\n"
         "                       consumers take 232 registers)\n"
         "  --persistent         the K/V ring's forward as a persistent "
         "kernel\n"
         "                       (sm_90a): a grid of the SMs loops over the\n"
         "                       tiles (FLASHJIT_PERSISTENT=0/1 overrides)\n"
         "  --query-tma          the ring's producer loads Q by its tensor "
         "map\n"
         "                       too (sm_90a; FLASHJIT_TMA=0/kv/qkv "
         "overrides).\n"
         "                       The default d = 128 tiling without a mask\n"
         "                       or modifier takes both\n";
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
         blockMGiven = true;
       }},
      {"--block-n",
       [&](auto &v) {
         o.config.blockN = parseInt("--block-n", v);
         blockNGiven = true;
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
         warpsGiven = true;
       }},
      {"--stages",
       [&](auto &v) {
         o.config.stages = parseInt("--stages", v);
         warpsGiven = true; // a tiling flag: the config comes from flags
       }},
      {"--kv-splits",
       [&](auto &v) {
         o.config.splits =
             v == "auto" ? TileConfig::kAutoSplits : parseInt("--kv-splits", v);
         if (o.config.splits == TileConfig::kAutoSplits && v != "auto")
           throw SpecError(
               fmt::format("--kv-splits: expected auto, 0 or 1..{}, got {}",
                           TileConfig::kMaxSplits, v));
         warpsGiven = true;
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
      {"--seqlens-q", [&](auto &v) { o.seqLensQ = parseLengths("--seqlens-q", v); }},
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
