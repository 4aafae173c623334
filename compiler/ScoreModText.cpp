//===- ScoreModText.cpp - Score modifiers given as region text ------------===//
//
/// \file
/// A score_mod region reaches the compiler from an attn-stage file
/// (--input), from the C API's spec.score_mod and from the CLI's
/// --score-mod, the last two as the region's text:
///
///   {
///   ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
///     %c = arith.constant 3.000000e+01 : f32
///     %x = arith.divf %s, %c : f32
///     %t = math.tanh %x : f32
///     %y = arith.mulf %t, %c : f32
///     attn.yield %y : f32
///   }
///
/// A mask_mod region comes the same ways ("{ ^bb0(%b: index, %h: index,
/// %i: index, %j: index): ... attn.yield %keep : i1 }": the C API's
/// spec.mask_mod, the CLI's --mask-mod) and becomes
/// AttentionSpec::maskModRegion, canonical as a score_mod's is.
///
/// Each becomes the same AttentionSpec: the named variant that the region
/// is after canonicalisation (the one above is softcap:30, so it shares
/// softcap:30's kernels; so does `30 * tanh(s / 30)`), or
/// "custom" with the region as MLIR prints it (SSA names and spacing
/// normalised: two spellings of one region share cache entries) and its
/// float64 evaluation for the reference. A region that the verifier
/// refuses (its signature, an op outside arith and math) or that cannot
/// run on tiles is refused here, before anything is compiled.
//
//===----------------------------------------------------------------------===//

#include "compiler/CompilerInternal.h"

#include "dialects/Attn/IR/AttnDialect.h"
#include "dialects/Attn/Transforms/ScoreMod.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/raw_ostream.h"

#include <fmt/format.h>
#include <map>
#include <mutex>
#include <optional>

using namespace mlir;

namespace flashjit {

/// The longest region text the compiler takes (the C API's limit too).
static constexpr size_t kMaxRegionText = 1 << 16;

/// Region \p keyword ("score_mod" or "mask_mod") of \p op as MLIR prints
/// it: the text after the keyword, from its "{" to the region's end ("" when
/// the op has no such region). The op prints score_mod before mask_mod.
static std::string printedRegion(Operation *op, const std::string &keyword) {
  std::string text;
  llvm::raw_string_ostream os(text);
  op->print(os);
  size_t at = text.find(" " + keyword + " {");
  if (at == std::string::npos)
    return "";
  size_t from = at + keyword.size() + 2;
  size_t to = keyword == "score_mod" ? text.find(" mask_mod {", from)
                                     : std::string::npos;
  return text.substr(from, to == std::string::npos ? to : to - from);
}

/// Canonicalisation and CSE on \p module (constants to the right of
/// commutative ops, constant arithmetic folded, dead ops gone, common
/// values shared); false when a pass fails.
static bool canonicalise(ModuleOp module) {
  PassManager pm(module.getContext());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  return succeeded(pm.run(module));
}

/// The canonical text of \p op's region \p keyword: printed from a
/// canonicalised copy, so that a description file's region and the same
/// region given as text are one spec.
static std::string canonicalRegion(Operation *op, const std::string &keyword) {
  OwningOpRef<ModuleOp> copy = ModuleOp::create(op->getLoc());
  copy->getBody()->push_back(op->clone());
  if (!canonicalise(*copy))
    throw CompileError("the " + keyword + " region does not canonicalise");
  std::string text = printedRegion(&copy->getBody()->front(), keyword);
  if (text.empty())
    throw CompileError("internal: a " + keyword +
                       " region printed without its keyword");
  return text;
}

void describeModifiers(Operation *op, std::optional<std::string> named,
                       Region &score, Region &mask, AttentionSpec &spec) {
  spec.scoreModRegion.clear();
  spec.scoreFunction.reset();
  spec.maskModRegion.clear();
  spec.maskFunction.reset();
  spec.captures = spec.maskCaptures = 0;
  {
    DiagnosticCollector diags(*op->getContext(), /*oneLine=*/true);
    for (Region *r : {&score, &mask})
      if (!r->empty() && !(r == &score && named) &&
          failed(attn::detail::checkScoreModTileable(op, *r)))
        throw CompileError(diags.str());
  }
  const int64_t scoreCaptures = attn::capturedTensors(score);
  const int64_t maskCaptures = attn::capturedTensors(mask);
  const int64_t total = scoreCaptures + maskCaptures;
  if (named) {
    spec.scoreMod = *named;
  } else {
    spec.scoreMod = kCustomScoreMod;
    spec.scoreModRegion = canonicalRegion(op, "score_mod");
    spec.scoreFunction = scoreFunctionOf(score, 0, total);
  }
  if (!mask.empty()) {
    spec.maskModRegion = canonicalRegion(op, "mask_mod");
    spec.maskFunction = scoreFunctionOf(mask, scoreCaptures, total);
    spec.maskCaptures = maskCaptures;
  }
  spec.captures = total;
}

/// What region texts make of a spec (describeModifiers' fields).
struct DescribedModifiers {
  std::string scoreMod, scoreModRegion, maskModRegion;
  std::shared_ptr<const ScoreFunction> scoreFunction, maskFunction;
  int64_t captures = 0, maskCaptures = 0;
};

/// Refuses a region text that is too long or does not start with "{".
static void checkRegionText(const std::string &keyword,
                            const std::string &region, const char *signature) {
  if (region.size() > kMaxRegionText)
    throw SpecError(fmt::format("{} region: {} characters, longer than {}",
                                keyword, region.size(), kMaxRegionText));
  size_t first = region.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || region[first] != '{')
    throw SpecError(
        fmt::format("{} region: expected its text, '{}'", keyword, signature));
}

/// \p spec with \p scoreText's score modifier (\p spec's own when "") and
/// \p maskText's mask modifier ("" for none): parsed, verified,
/// canonicalised and described (withModifierRegions without its memo).
static DescribedModifiers describeRegionTexts(const AttentionSpec &spec,
                                              const std::string &scoreText,
                                              const std::string &maskText) {
  const std::string what = scoreText.empty()   ? "mask_mod region"
                           : maskText.empty() ? "score_mod region"
                                              : "score_mod / mask_mod regions";
  auto refuse = [&](const std::string &why) {
    return SpecError(what + ": " + why);
  };
  AttentionSpec described = spec;
  if (!scoreText.empty()) {
    checkRegionText("score_mod", scoreText,
                    "{ ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: "
                    "index): ... attn.yield %y : f32 }");
    described.scoreMod = kCustomScoreMod;
    described.scoreModRegion = scoreText;
  }
  if (!maskText.empty())
    checkRegionText("mask_mod", maskText,
                    "{ ^bb0(%b: index, %h: index, %i: index, %j: index): ... "
                    "attn.yield %keep : i1 }");
  described.maskModRegion = maskText;
  described.scoreFunction.reset();
  described.maskFunction.reset();
  KernelSource source;
  source.text = attnModuleText(described, kKernelName);
  source.name = maskText.empty() ? "score_mod" : "mask_mod";
  auto ctx = createContext();
  DiagnosticCollector diags(*ctx, /*oneLine=*/true);
  auto module =
      parseSourceString<ModuleOp>(source.text, ctx.get(), source.name);
  if (!module)
    throw refuse(diags.str().empty() ? "does not parse" : diags.str());
  // Canonical form first (constants to the right of commutative ops,
  // constant arithmetic folded, dead ops gone, common values shared):
  // `30 * tanh(s / 30)` is then softcap:30's region, and two spellings of
  // one function more often one cache entry.
  if (!canonicalise(*module))
    throw refuse(diags.str().empty() ? "does not canonicalise" : diags.str());
  // Only the one description: a text that closes the region early and
  // goes on with ops of its own is refused.
  Block *body = module->getBody();
  if (body->getOperations().size() != 1)
    throw refuse("its text closes the region and goes on after it");
  Operation *op = &body->front();
  try {
    if (auto fwd = dyn_cast<attn::FlashFwdOp>(op))
      describeModifiers(op, fwd.namedScoreMod(), fwd.getScoreMod(),
                        fwd.getMaskMod(), described);
    else if (auto bwd = dyn_cast<attn::FlashBwdOp>(op))
      describeModifiers(op, bwd.namedScoreMod(), bwd.getScoreMod(),
                        bwd.getMaskMod(), described);
    else
      throw refuse("its text closes the region and goes on after it");
  } catch (const CompileError &e) {
    throw refuse(e.what());
  }
  if (!maskText.empty() && described.maskModRegion.empty())
    throw refuse("its text closes the region and goes on after it");
  return {described.scoreMod,      described.scoreModRegion,
          described.maskModRegion, described.scoreFunction,
          described.maskFunction,  described.captures,
          described.maskCaptures};
}

AttentionSpec withModifierRegions(const AttentionSpec &spec,
                                  const std::string &scoreText,
                                  const std::string &maskText) {
  if (scoreText.empty() && maskText.empty() && spec.maskModRegion.empty())
    return spec;
  // The C API converts its spec at every call: a region's description
  // (a context, a parse, canonicalisation: about 1 ms) is kept by its
  // texts (and the named score modifier beside a mask), which alone decide
  // it (flash_fwd and flash_bwd read a region alike). At most kMemoEntries
  // keys; errors are not kept.
  static constexpr size_t kMemoEntries = 64;
  static std::mutex mutex;
  static std::map<std::string, DescribedModifiers> memo;
  const std::string &score =
      !scoreText.empty() || spec.scoreMod != kCustomScoreMod
          ? scoreText
          : spec.scoreModRegion;
  const std::string key =
      (score.empty() ? "named:" + spec.scoreMod : score) + '\0' + maskText;
  std::optional<DescribedModifiers> d;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = memo.find(key); it != memo.end())
      d = it->second;
  }
  if (!d) {
    d = describeRegionTexts(spec, score, maskText);
    std::lock_guard<std::mutex> lock(mutex);
    if (memo.size() >= kMemoEntries)
      memo.clear();
    memo.emplace(key, *d);
  }
  AttentionSpec out = spec;
  out.scoreMod = d->scoreMod;
  out.scoreModRegion = d->scoreModRegion;
  out.scoreFunction = d->scoreFunction;
  out.maskModRegion = d->maskModRegion;
  out.maskFunction = d->maskFunction;
  out.captures = d->captures;
  out.maskCaptures = d->maskCaptures;
  return out;
}

AttentionSpec withScoreModRegion(const AttentionSpec &spec,
                                 const std::string &region) {
  if (region.empty())
    throw SpecError("score_mod region: expected its text, '{ ^bb0(%s: f32, "
                    "%b: index, %h: index, %i: index, %j: index): ... "
                    "attn.yield %y : f32 }'");
  return withModifierRegions(spec, region, spec.maskModRegion);
}

AttentionSpec withMaskModRegion(const AttentionSpec &spec,
                                const std::string &region) {
  if (region.empty())
    throw SpecError("mask_mod region: expected its text, '{ ^bb0(%b: index, "
                    "%h: index, %i: index, %j: index): ... attn.yield %keep "
                    ": i1 }'");
  return withModifierRegions(spec, "", region);
}

std::pair<bool, bool> maskModReadsBatchHead(const AttentionSpec &spec) {
  if (spec.maskModRegion.empty())
    return {false, false};
  AttentionSpec forward = spec;
  forward.direction = Direction::Forward;
  auto ctx = createContext();
  DiagnosticCollector diags(*ctx, /*oneLine=*/true);
  auto module = parseSourceString<ModuleOp>(
      attnModuleText(forward, kKernelName), ctx.get(), "mask_mod");
  if (!module)
    throw SpecError("mask_mod region: " +
                    (diags.str().empty() ? "does not parse" : diags.str()));
  std::pair<bool, bool> reads{true, true};
  module->walk([&](attn::FlashFwdOp op) {
    Region &region = op.getMaskMod();
    reads = {!region.getArgument(0).use_empty(),
             !region.getArgument(1).use_empty()};
  });
  return reads;
}

/// Throws SpecError unless the modifier regions of \p module capture
/// \p spec's count of tensors (the buffers the CPU mode passes after the
/// kernel ABI's: a spec whose region was set by hand without its count
/// would pass too few).
void checkScoreModCaptures(ModuleOp module, const AttentionSpec &spec) {
  auto check = [&](auto op) {
    int64_t total = attn::totalCapturedTensors(op);
    int64_t mask = attn::capturedTensors(op.getMaskMod());
    if (total != spec.captures || mask != spec.maskCaptures)
      throw SpecError(fmt::format(
          "the modifier regions capture {} tensors ({} the mask_mod's), the "
          "spec says {} ({}) (withModifierRegions sets the counts with the "
          "regions)",
          total, mask, spec.captures, spec.maskCaptures));
  };
  module.walk([&](Operation *op) {
    if (auto fwd = dyn_cast<attn::FlashFwdOp>(op))
      check(fwd);
    if (auto bwd = dyn_cast<attn::FlashBwdOp>(op))
      check(bwd);
  });
}

} // namespace flashjit
