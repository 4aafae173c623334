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

/// The score_mod region of \p op as MLIR prints it: the text after the
/// `score_mod` keyword, from its "{" to the op's end.
static std::string printedRegion(Operation *op) {
  std::string text;
  llvm::raw_string_ostream os(text);
  op->print(os);
  const std::string keyword = "score_mod {";
  size_t at = text.find(keyword);
  if (at == std::string::npos)
    throw CompileError("internal: a score_mod region printed without its "
                       "keyword");
  return text.substr(at + keyword.size() - 1);
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

/// The canonical text of \p op's region: printed from a canonicalised
/// copy, so that a description file's region and the same region given as
/// text are one spec.
static std::string canonicalRegion(Operation *op) {
  OwningOpRef<ModuleOp> copy = ModuleOp::create(op->getLoc());
  copy->getBody()->push_back(op->clone());
  if (!canonicalise(*copy))
    throw CompileError("the score_mod region does not canonicalise");
  return printedRegion(&copy->getBody()->front());
}

void describeScoreMod(Operation *op, std::optional<std::string> named,
                      Region &region, AttentionSpec &spec) {
  spec.scoreModRegion.clear();
  spec.scoreFunction.reset();
  spec.captures = 0;
  if (named) {
    spec.scoreMod = *named;
    return;
  }
  {
    DiagnosticCollector diags(*op->getContext(), /*oneLine=*/true);
    if (failed(attn::detail::checkScoreModTileable(op, region)))
      throw CompileError(diags.str());
  }
  spec.scoreMod = kCustomScoreMod;
  spec.scoreModRegion = canonicalRegion(op);
  spec.scoreFunction = scoreFunctionOf(region);
  spec.captures = attn::capturedTensors(region);
}

/// What a region's text makes of a spec (describeScoreMod's fields).
struct DescribedScoreMod {
  std::string scoreMod, scoreModRegion;
  std::shared_ptr<const ScoreFunction> scoreFunction;
  int64_t captures = 0;
};

/// \p spec with \p region's modifier: parsed, verified, canonicalised and
/// described (withScoreModRegion without its memo).
static DescribedScoreMod describeRegionText(const AttentionSpec &spec,
                                            const std::string &region) {
  auto refuse = [](const std::string &why) {
    return SpecError("score_mod region: " + why);
  };
  if (region.size() > kMaxRegionText)
    throw refuse(fmt::format("{} characters, longer than {}", region.size(),
                             kMaxRegionText));
  if (region.find_first_not_of(" \t\r\n") == std::string::npos ||
      region[region.find_first_not_of(" \t\r\n")] != '{')
    throw refuse("expected its text, '{ ^bb0(%s: f32, %b: index, %h: index, "
                 "%i: index, %j: index): ... attn.yield %y : f32 }'");
  AttentionSpec described = spec;
  described.scoreMod = kCustomScoreMod;
  described.scoreModRegion = region;
  described.scoreFunction.reset();
  KernelSource source;
  source.text = attnModuleText(described, kKernelName);
  source.name = "score_mod";
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
      describeScoreMod(op, fwd.namedScoreMod(), fwd.getScoreMod(), described);
    else if (auto bwd = dyn_cast<attn::FlashBwdOp>(op))
      describeScoreMod(op, bwd.namedScoreMod(), bwd.getScoreMod(), described);
    else
      throw refuse("its text closes the region and goes on after it");
  } catch (const CompileError &e) {
    throw refuse(e.what());
  }
  return {described.scoreMod, described.scoreModRegion, described.scoreFunction,
          described.captures};
}

AttentionSpec withScoreModRegion(const AttentionSpec &spec,
                                 const std::string &region) {
  // The C API converts its spec at every call: a region's description
  // (a context, a parse, canonicalisation: about 1 ms) is kept by its
  // text, which alone decides it (flash_fwd and flash_bwd read a region
  // alike). At most kMemoEntries texts; errors are not kept.
  static constexpr size_t kMemoEntries = 64;
  static std::mutex mutex;
  static std::map<std::string, DescribedScoreMod> memo;
  std::optional<DescribedScoreMod> d;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = memo.find(region); it != memo.end())
      d = it->second;
  }
  if (!d) {
    d = describeRegionText(spec, region);
    std::lock_guard<std::mutex> lock(mutex);
    if (memo.size() >= kMemoEntries)
      memo.clear();
    memo.emplace(region, *d);
  }
  AttentionSpec out = spec;
  out.scoreMod = d->scoreMod;
  out.scoreModRegion = d->scoreModRegion;
  out.scoreFunction = d->scoreFunction;
  out.captures = d->captures;
  return out;
}

/// Throws SpecError unless the score_mod regions of \p module capture
/// \p spec's count of tensors (the buffers the CPU mode passes after the
/// kernel ABI's: a spec whose region was set by hand without its count
/// would pass too few).
void checkScoreModCaptures(ModuleOp module, const AttentionSpec &spec) {
  module.walk([&](Operation *op) {
    Region *region = nullptr;
    if (auto fwd = dyn_cast<attn::FlashFwdOp>(op); fwd && fwd.hasScoreMod())
      region = &fwd.getScoreMod();
    if (auto bwd = dyn_cast<attn::FlashBwdOp>(op); bwd && bwd.hasScoreMod())
      region = &bwd.getScoreMod();
    if (region && attn::capturedTensors(*region) != spec.captures)
      throw SpecError(fmt::format(
          "the score_mod region captures {} tensors, the spec says {} "
          "(withScoreModRegion sets the count with the region)",
          attn::capturedTensors(*region), spec.captures));
  });
}

} // namespace flashjit
