//===- AttentionSpec.cpp - Validation and printing of the description -----===//

#include "kernels/AttentionSpec.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <optional>
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
  checkRange("head_dim_qk", headDimQK, 1, 512);
  checkRange("head_dim_v", headDimV, 1, 512);
  checkRange("gqa", gqaGroup, 1, 1 << 16);
  if (blockSparse)
    checkRange("sparse_block", sparseBlock, 1, 1 << 16);
  if (!scoreMod.empty()) {
    softcapOf(scoreMod);
    if (direction == Direction::Backward)
      throw SpecError(fmt::format("score modifier '{}': the backward of a "
                                  "score modifier is not derived yet",
                                  scoreMod));
  }
}

double softcapOf(const std::string &scoreMod) {
  const std::string prefix = "softcap:";
  auto bad = [&] {
    return SpecError(fmt::format(
        "score modifier '{}': expected softcap:C with a finite C > 0 (the "
        "named variants: softcap)",
        scoreMod));
  };
  if (scoreMod.rfind(prefix, 0) != 0 || scoreMod.size() == prefix.size())
    throw bad();
  std::string text = scoreMod.substr(prefix.size());
  char *end = nullptr;
  double cap = std::strtod(text.c_str(), &end);
  if (*end != '\0' || !std::isfinite(cap) || !(cap > 0) ||
      !std::isfinite(float(cap)) || float(cap) == 0.0f)
    throw bad();
  return cap;
}

double applyScoreMod(const AttentionSpec &spec, double score) {
  if (spec.scoreMod.empty())
    return score;
  double cap = double(float(softcapOf(spec.scoreMod)));
  return cap * std::tanh(score / cap);
}

std::string AttentionSpec::name() const {
  std::string s = fmt::format("{}_{}_dqk{}_dv{}_{}_g{}",
                              direction == Direction::Forward ? "fwd" : "bwd",
                              toString(dtype), headDimQK, headDimV,
                              toString(mask), gqaGroup);
  if (blockSparse)
    s += fmt::format("_bs{}", sparseBlock);
  if (direction == Direction::Backward && deterministic)
    s += "_det";
  if (!scoreMod.empty()) {
    std::string mod = scoreMod;
    std::replace(mod.begin(), mod.end(), ':', '_');
    s += "_" + mod;
  }
  return s;
}

std::string AttentionSpec::toJson() const {
  return fmt::format(
      "{{\"direction\":\"{}\",\"head_dim_qk\":{},\"head_dim_v\":{},"
      "\"dtype\":\"{}\",\"mask\":\"{}\",\"gqa\":{},\"block_sparse\":{},"
      "\"sparse_block\":{}{}{}}}",
      direction == Direction::Forward ? "forward" : "backward", headDimQK,
      headDimV, toString(dtype), toString(mask), gqaGroup,
      blockSparse ? "true" : "false", sparseBlock,
      direction == Direction::Backward
          ? fmt::format(",\"deterministic\":{}", deterministic)
          : std::string(),
      scoreMod.empty() ? std::string()
                       : fmt::format(",\"score_mod\":\"{}\"", scoreMod));
}

void TileConfig::validate(const AttentionSpec &spec) const {
  checkRange("block_m", blockM, 1, 256);
  checkRange("block_n", blockN, 1, 256);
  checkRange("warps", warps, 1, 16);
  checkRange("stages", stages, 1, 8);
  if (spec.blockSparse) {
    if (spec.sparseBlock % blockM != 0)
      throw SpecError(fmt::format("block_m ({}) must divide sparse_block ({})",
                                  blockM, spec.sparseBlock));
    if (spec.sparseBlock % blockN != 0)
      throw SpecError(fmt::format("block_n ({}) must divide sparse_block ({})",
                                  blockN, spec.sparseBlock));
  }
}

std::string TileConfig::toJson() const {
  return fmt::format(
      "{{\"block_m\":{},\"block_n\":{},\"warps\":{},\"stages\":{}}}", blockM,
      blockN, warps, stages);
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

/// The score_mod region of \p spec's named modifier (after the attribute
/// dictionary), "" for none.
static std::string scoreModRegionText(const AttentionSpec &spec) {
  if (spec.scoreMod.empty())
    return "";
  // C * tanh(score / C), C printed exactly as an f32 (hex float).
  float cap = float(softcapOf(spec.scoreMod));
  uint32_t bits;
  std::memcpy(&bits, &cap, sizeof bits);
  return fmt::format(
      " score_mod {{\n  ^bb0(%s: f32, %b: index, %h: index, %i: index, "
      "%j: index):\n    %c = arith.constant 0x{:08X} : f32\n"
      "    %x = arith.divf %s, %c : f32\n    %t = math.tanh %x : f32\n"
      "    %y = arith.mulf %t, %c : f32\n    attn.yield %y : f32\n  }}",
      bits);
}

std::string attnModuleText(const AttentionSpec &spec, const std::string &name) {
  // The backward's `deterministic` only when set (false is its default).
  const bool backward = spec.direction == Direction::Backward;
  return fmt::format(
      "module {{\n  attn.{} @{} {{element_type = {}, gqa = {} : i64, "
      "head_dim_qk = {} : i64, head_dim_v = {} : i64, mask = \"{}\", "
      "sparse_block = {} : i64{}}}{}\n}}\n",
      backward ? "flash_bwd" : "flash_fwd", name,
      spec.dtype == DType::BF16 ? "bf16" : "f16", spec.gqaGroup, spec.headDimQK,
      spec.headDimV, toString(spec.mask),
      spec.blockSparse ? spec.sparseBlock : 0,
      backward && spec.deterministic ? ", deterministic = true" : "",
      scoreModRegionText(spec));
}

int64_t backwardWorkspaceBytes(const AttentionSpec &spec, const Problem &p) {
  int64_t rows = p.batch * p.heads * p.seqLenQ;
  int64_t bytes = 2 * rows * 4; // delta, -lse * log2(e)
  if (dqAccumulation(spec) == DqAccumulation::Atomic)
    bytes += rows * spec.headDimQK * 4; // dq_accum
  return bytes;
}

} // namespace flashjit
