//===- AttentionSpec.cpp - Validation and printing of the description -----===//

#include "kernels/AttentionSpec.h"
#include "kernels/KernelABI.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

namespace flashjit {

const char *toString(DType dtype) {
  return dtype == DType::BF16 ? "bf16" : "fp16";
}

const char *toString(MaskKind mask) {
  switch (mask) {
  case MaskKind::None:
    return "none";
  case MaskKind::Causal:
    return "causal";
  case MaskKind::SlidingWindow:
    return "sliding_window";
  }
  return "?";
}

const char *toString(DqAccumulation mode) {
  return mode == DqAccumulation::Atomic ? "atomic" : "separate_pass";
}

/// Throws a SpecError "<field> must be in [lo, hi], got <value>".
static void checkRange(const char *field, int64_t value, int64_t lo,
                       int64_t hi) {
  if (value < lo || value > hi)
    throw SpecError(
        fmt::format("{} must be in [{}, {}], got {}", field, lo, hi, value));
}

void AttentionSpec::validate() const {
  if (maskCaptures < 0 || maskCaptures > captures ||
      (maskCaptures > 0 && maskModRegion.empty()))
    throw SpecError(fmt::format("mask_captures: {} of {} captured tensors "
                                "for a mask_mod region{}",
                                maskCaptures, captures,
                                maskModRegion.empty() ? " it does not have"
                                                      : ""));
  if (captures < 0 ||
      (captures - maskCaptures > 0 && scoreMod != kCustomScoreMod))
    throw SpecError(fmt::format("captures: {} captured tensors without a "
                                "score_mod region that reads them",
                                captures - maskCaptures));
  if (captures > abi::kMaxCaptures)
    throw SpecError(fmt::format("a score modifier may capture at most {} "
                                "tensors, this one captures {}",
                                abi::kMaxCaptures, captures));
  if (captureGrads < 0 || (captureGrads >> (captures - maskCaptures)) != 0)
    throw SpecError(fmt::format("capture_grads: {:#x} names captured tensors "
                                "beyond the score_mod region's {}{}",
                                captureGrads, captures - maskCaptures,
                                maskCaptures ? " (a mask_mod's take no "
                                               "gradient)"
                                             : ""));
  checkRange("head_dim_qk", headDimQK, 1, 512);
  checkRange("head_dim_v", headDimV, 1, 512);
  checkRange("gqa", gqaGroup, 1, 1 << 16);
  if (blockSparse)
    checkRange("sparse_block", sparseBlock, 1, 1 << 16);
  if (!scoreMod.empty() || !maskModRegion.empty())
    ScoreMod::of(*this);
}

/// The spelling of \p kind in AttentionSpec::scoreMod.
static const char *kindName(ScoreMod::Kind kind) {
  return kind == ScoreMod::Kind::Softcap ? "softcap" : "alibi";
}

/// The largest H of alibi:H: Problem's largest head count.
constexpr int64_t kMaxAlibiHeads = int64_t(1) << 20;

/// The modifier of \p kind with \p argument; a SpecError quoting \p text
/// when \p argument (nullopt: none, or no number) is not one of the kind's.
static ScoreMod checkedScoreMod(ScoreMod::Kind kind,
                                std::optional<double> argument,
                                const std::string &text) {
  ScoreMod mod;
  mod.kind = kind;
  const double v = argument.value_or(0);
  if (kind == ScoreMod::Kind::Softcap) {
    if (!std::isfinite(v) || !(v > 0) || !std::isfinite(float(v)) ||
        float(v) == 0.0f)
      throw SpecError(fmt::format("score modifier '{}': expected softcap:C "
                                  "with a finite C > 0",
                                  text));
    mod.cap = double(float(v));
    return mod;
  }
  if (!(v >= 1 && v <= double(kMaxAlibiHeads)) || v != std::floor(v))
    throw SpecError(fmt::format("score modifier '{}': expected alibi:H with "
                                "the head count H an integer in [1, {}]",
                                text, kMaxAlibiHeads));
  mod.heads = int64_t(v);
  return mod;
}

namespace {
/// A modifier under a mask_mod region (ScoreMod::of): -inf where the mask
/// yields false, the modifier elsewhere. The captured tensors it is given
/// are the spec's (score_mod's, then the mask's).
class MaskedScoreFunction : public ScoreFunction {
public:
  MaskedScoreFunction(ScoreMod inner, std::shared_ptr<const ScoreFunction> mask)
      : inner(std::move(inner)), mask(std::move(mask)) {}

  double apply(double score, int64_t batch, int64_t head, int64_t qIdx,
               int64_t kvIdx, const Captures *captures,
               double *dScore) const override {
    if (!keeps(batch, head, qIdx, kvIdx, captures)) {
      *dScore = 0;
      return -std::numeric_limits<double>::infinity();
    }
    ScoreMod m = inner.reading(captures);
    *dScore = m.derivative(score, head, qIdx, kvIdx, batch);
    return m.apply(score, head, qIdx, kvIdx, batch);
  }

  std::vector<CaptureRead>
  captureReads(double score, int64_t batch, int64_t head, int64_t qIdx,
               int64_t kvIdx, const Captures *captures) const override {
    if (!keeps(batch, head, qIdx, kvIdx, captures))
      return {};
    return inner.reading(captures).captureReads(score, head, qIdx, kvIdx,
                                                batch);
  }

private:
  bool keeps(int64_t batch, int64_t head, int64_t qIdx, int64_t kvIdx,
             const Captures *captures) const {
    double d;
    return mask->apply(0.0, batch, head, qIdx, kvIdx, captures, &d) != 0.0;
  }

  ScoreMod inner;
  std::shared_ptr<const ScoreFunction> mask;
};
} // namespace

ScoreMod ScoreMod::of(const AttentionSpec &spec) {
  if (!spec.maskModRegion.empty()) {
    if (!spec.maskFunction)
      throw SpecError("a mask_mod region comes from its text or a "
                      "description, with its evaluation "
                      "(withModifierRegions)");
    AttentionSpec unmasked = spec;
    unmasked.maskModRegion.clear();
    unmasked.maskFunction.reset();
    ScoreMod mod;
    mod.kind = Kind::Custom;
    mod.custom = std::make_shared<MaskedScoreFunction>(
        unmasked.scoreMod.empty() ? ScoreMod() : of(unmasked),
        spec.maskFunction);
    return mod;
  }
  if (spec.scoreMod != kCustomScoreMod)
    return parse(spec.scoreMod);
  if (!spec.scoreFunction)
    throw SpecError("score modifier 'custom': a score_mod region that is no "
                    "named variant comes from its text or a description "
                    "(--input FILE.mlir of the attn stage), not from a "
                    "name");
  ScoreMod mod;
  mod.kind = Kind::Custom;
  mod.custom = spec.scoreFunction;
  return mod;
}

ScoreMod ScoreMod::parse(const std::string &text) {
  if (text.empty())
    return ScoreMod();
  if (text == kCustomScoreMod)
    throw SpecError("score modifier 'custom': a region that is no named "
                    "variant is given as its text ('{ ^bb0(%s: f32, %b: "
                    "index, %h: index, %i: index, %j: index): ... }') or by "
                    "a description (--input FILE.mlir of the attn stage), "
                    "not by name; the named variants are softcap:C and "
                    "alibi:H");
  for (Kind kind : kNamedKinds) {
    const std::string name = kindName(kind), prefix = name + ":";
    if (text != name && text.rfind(prefix, 0) != 0)
      continue;
    std::string arg = text.substr(std::min(text.size(), prefix.size()));
    // A number and nothing after it; alibi's H in decimal digits only.
    char *end = nullptr;
    double value = std::strtod(arg.c_str(), &end);
    bool isNumber = !arg.empty() && *end == '\0' &&
                    (kind != Kind::Alibi ||
                     arg.find_first_not_of("0123456789") == std::string::npos);
    return checkedScoreMod(
        kind, isNumber ? std::optional<double>(value) : std::nullopt, text);
  }
  throw SpecError(fmt::format("score modifier '{}': unknown; the named "
                              "variants are softcap:C and alibi:H",
                              text));
}

ScoreMod ScoreMod::of(Kind kind, double argument) {
  return checkedScoreMod(kind, argument,
                         fmt::format("{}:{}", kindName(kind), argument));
}

std::string ScoreMod::name() const {
  switch (kind) {
  case Kind::None:
    return "";
  case Kind::Softcap:
    return fmt::format("softcap:{}", float(cap)); // shortest exact f32 text
  case Kind::Alibi:
    return fmt::format("alibi:{}", heads);
  case Kind::Custom:
    return kCustomScoreMod;
  }
  return "";
}

double ScoreMod::apply(double score, int64_t head, int64_t qIdx, int64_t kvIdx,
                       int64_t batch) const {
  double unused;
  switch (kind) {
  case Kind::Custom:
    return custom->apply(score, batch, head, qIdx, kvIdx, captures, &unused);
  case Kind::None:
    return score;
  case Kind::Softcap:
    return cap * std::tanh(score / cap);
  case Kind::Alibi:
    return score + std::exp2(-8.0 * double(head + 1) / double(heads)) *
                       double(kvIdx - qIdx);
  }
  return score;
}

double ScoreMod::derivative(double score, int64_t head, int64_t qIdx,
                            int64_t kvIdx, int64_t batch) const {
  if (kind == Kind::Custom) {
    double d = 0;
    custom->apply(score, batch, head, qIdx, kvIdx, captures, &d);
    return d;
  }
  if (kind != Kind::Softcap)
    return 1.0; // none and alibi add a constant to the score
  double t = std::tanh(score / cap);
  return 1.0 - t * t;
}

std::string AttentionSpec::name() const {
  std::string s = fmt::format("{}_{}_dqk{}_dv{}_{}_g{}",
                              direction == Direction::Forward ? "fwd" : "bwd",
                              toString(dtype), headDimQK, headDimV,
                              toString(mask), gqaGroup);
  if (blockSparse)
    s += fmt::format("_bs{}", sparseBlock);
  if (varlen)
    s += "_varlen";
  if (direction == Direction::Backward && deterministic)
    s += "_det";
  if (direction == Direction::Backward && captureGrads)
    s += fmt::format("_cg{:x}", captureGrads);
  if (!scoreMod.empty()) {
    std::string mod = scoreMod;
    std::replace(mod.begin(), mod.end(), ':', '_');
    s += "_" + mod;
  }
  // A custom region's FNV-1a hash: names key the C API's kernel maps.
  auto hashOf = [](const std::string &text) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : text)
      h = (h ^ c) * 1099511628211ull;
    return h;
  };
  if (!scoreModRegion.empty())
    s += fmt::format("_{:016x}", hashOf(scoreModRegion));
  if (!maskModRegion.empty())
    s += fmt::format("_mask_{:016x}", hashOf(maskModRegion));
  return s;
}

void TileConfig::validate(const AttentionSpec &spec) const {
  checkRange("block_m", blockM, 1, 256);
  checkRange("block_n", blockN, 1, 256);
  checkRange("warps", warps, 1, 16);
  checkRange("stages", stages, 1, 8);
  if (splits < kAutoSplits || splits > kMaxSplits)
    throw SpecError(fmt::format(
        "splits (split-KV) must be 0 (one pass), 1..{} or auto, got {}",
        kMaxSplits, splits));
  if (splits && spec.direction == Direction::Backward)
    throw SpecError("splits (split-KV) is a forward tiling; the backward "
                    "takes none");
  const std::pair<bool, const char *> forwardOnly[] = {
      {overlapSoftmax, "overlap_softmax"},
      {persistent, "persistent"},
      {queryByTensorMap, "query_tma"},
      {outputByTensorMap, "output_tma"}};
  for (auto [set, name] : forwardOnly)
    if (set && spec.direction == Direction::Backward)
      throw SpecError(
          fmt::format("{} is a forward tiling; the backward takes none", name));
  if (outputByTensorMap && !queryByTensorMap)
    throw SpecError("output_tma needs query_tma: O's tensor map stores from "
                    "the slot that Q by its map gives O");
  if (spec.blockSparse) {
    if (spec.sparseBlock % blockM != 0)
      throw SpecError(fmt::format("block_m ({}) must divide sparse_block ({})",
                                  blockM, spec.sparseBlock));
    if (spec.sparseBlock % blockN != 0)
      throw SpecError(fmt::format("block_n ({}) must divide sparse_block ({})",
                                  blockN, spec.sparseBlock));
  }
}

void Problem::validate(const AttentionSpec &spec) const {
  checkRange("batch", batch, 1, int64_t(1) << 20);
  checkRange("heads", heads, 1, int64_t(1) << 20);
  checkRange("seq_len", seqLenQ, 1, int64_t(1) << 24);
  checkRange("seq_len_kv", seqLenKV, 1, int64_t(1) << 24);
  if (heads % spec.gqaGroup != 0)
    throw SpecError(
        fmt::format("heads ({}) must be a multiple of the gqa group size ({})",
                    heads, spec.gqaGroup));
  if (ScoreMod mod = ScoreMod::of(spec);
      mod.kind == ScoreMod::Kind::Alibi && heads != mod.heads)
    throw SpecError(fmt::format(
        "heads ({}) must be the H of score modifier '{}' ({}): its slopes "
        "2^(-8 (h + 1) / H) are those of H query heads",
        heads, spec.scoreMod, mod.heads));
  if (windowLeft < 0 || windowRight < 0)
    throw SpecError(fmt::format("window must be non-negative, got {},{}",
                                windowLeft, windowRight));
  if (!std::isfinite(scale) || scale < 0)
    throw SpecError(fmt::format(
        "scale must be finite and >= 0 (0 = 1/sqrt(head_dim)), got {}", scale));
  if (scale != 0 && (scale < kMinScale || scale > kMaxScale))
    throw SpecError(fmt::format(
        "scale must be 0 (1/sqrt(head_dim)) or in [2^-126, 2^63] = [{:g}, "
        "{:g}] (f32 normal, and scale * log2(e) * score finite in f32 for "
        "every |score| < 2^64), got {}",
        kMinScale, kMaxScale, scale));
}

namespace {
/// The product of \p factors, or nullopt when it overflows int64.
std::optional<int64_t> checkedProduct(const std::vector<int64_t> &factors) {
  int64_t product = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(product, f, &product))
      return std::nullopt;
  return product;
}
} // namespace

void checkProblemSize(const AttentionSpec &spec, const Problem &p) {
  const int64_t kvHeads = p.heads / std::max<int64_t>(1, spec.gqaGroup);
  struct Tensor {
    const char *name, *formula;
    std::vector<int64_t> factors;
  };
  const Tensor tensors[] = {
      {"q",
       "batch * heads * seq_len * head_dim_qk",
       {p.batch, p.heads, p.seqLenQ, spec.headDimQK}},
      {"k",
       "batch * kv_heads * seq_len_kv * head_dim_qk",
       {p.batch, kvHeads, p.seqLenKV, spec.headDimQK}},
      {"v",
       "batch * kv_heads * seq_len_kv * head_dim_v",
       {p.batch, kvHeads, p.seqLenKV, spec.headDimV}},
      {"o",
       "batch * heads * seq_len * head_dim_v",
       {p.batch, p.heads, p.seqLenQ, spec.headDimV}},
      {"lse", "batch * heads * seq_len", {p.batch, p.heads, p.seqLenQ}},
  };
  std::vector<Tensor> all(std::begin(tensors), std::end(tensors));
  if (spec.blockSparse && spec.sparseBlock >= 1) {
    // A layout broadcast over batch and heads: [q_blocks, kv_blocks].
    int64_t sb = spec.sparseBlock;
    all.push_back({"the layout's indices",
                   "q_blocks * kv_blocks",
                   {(p.seqLenQ + sb - 1) / sb, (p.seqLenKV + sb - 1) / sb}});
  }
  for (const Tensor &t : all) {
    std::optional<int64_t> n = checkedProduct(t.factors);
    if (n && *n <= kMaxTensorElements)
      continue;
    std::string factors;
    for (int64_t f : t.factors)
      factors += (factors.empty() ? "" : " * ") + std::to_string(f);
    throw SpecError(fmt::format(
        "problem too large: {} would hold {} = {} elements{}; the limit is "
        "2^40 ({}) elements per tensor",
        t.name, t.formula, factors + (n ? fmt::format(" = {}", *n) : ""),
        n ? "" : " (overflows int64)", kMaxTensorElements));
  }
}

void checkTensorReach(const char *what, const int64_t *shape,
                      const int64_t *strides) {
  int64_t reach = 0;
  for (int i = 0; i < 4; ++i) {
    int64_t step;
    if (__builtin_mul_overflow(shape[i] - 1, strides[i], &step) ||
        __builtin_add_overflow(reach, step, &reach) || reach > kMaxTensorReach)
      throw SpecError(fmt::format(
          "{}: shape [{}, {}, {}, {}] with strides [{}, {}, {}, {}] reaches "
          "past element 2^47 ({}) of its base (sum of (shape[i] - 1) * "
          "strides[i]): no buffer is that large",
          what, shape[0], shape[1], shape[2], shape[3], strides[0], strides[1],
          strides[2], strides[3], kMaxTensorReach));
  }
}

double Problem::effectiveScale(const AttentionSpec &spec) const {
  return scale != 0 ? scale : 1.0 / std::sqrt(double(spec.headDimQK));
}

std::pair<int64_t, int64_t> effectiveWindow(const AttentionSpec &spec,
                                            const Problem &problem) {
  switch (spec.mask) {
  case MaskKind::None:
    return {kUnboundedWindow, kUnboundedWindow};
  case MaskKind::Causal:
    return {kUnboundedWindow, 0};
  case MaskKind::SlidingWindow:
    return {std::min(problem.windowLeft, kUnboundedWindow),
            std::min(problem.windowRight, kUnboundedWindow)};
  }
  return {kUnboundedWindow, kUnboundedWindow};
}

std::string Problem::toJson(const AttentionSpec &spec) const {
  auto [left, right] = effectiveWindow(spec, *this);
  auto side = [](int64_t w) {
    return w >= kUnboundedWindow ? std::string("null") : std::to_string(w);
  };
  return fmt::format("{{\"batch\":{},\"heads\":{},\"kv_heads\":{},"
                     "\"seq_len\":{},\"seq_len_kv\":{},\"scale\":{},"
                     "\"window_left\":{},\"window_right\":{}}}",
                     batch, heads, kvHeads(spec), seqLenQ, seqLenKV,
                     effectiveScale(spec), side(left), side(right));
}

int64_t backwardWorkspaceBytes(const AttentionSpec &spec, const Problem &p) {
  int64_t rows = p.batch * p.heads * p.seqLenQ;
  if (dqAccumulation(spec) != DqAccumulation::Atomic)
    return 2 * rows * 4; // delta, -lse * log2(e)
  // Then dq_accum, 16-byte aligned.
  return abi::bwd::dqAccumOffsetBytes(rows) + rows * spec.headDimQK * 4;
}

} // namespace flashjit
