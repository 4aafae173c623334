//===- SpecText.cpp - The description, tiling and attn module as text -----===//
//
/// \file
/// The texts of a description: its JSON (part of every cache key, and of
/// `run --json`), the tiling's JSON (the tuned configs' record, read back by
/// loadTunedConfig), and the `attn` module that the compiler starts from,
/// with a named score modifier's region.
//
//===----------------------------------------------------------------------===//

#include "kernels/AttentionSpec.h"

#include <cstdint>
#include <cstring>
#include <fmt/format.h>
#include <string>

namespace flashjit {

/// \p text as the inside of a JSON string: quotes, backslashes and
/// control characters escaped.
static std::string jsonEscaped(const std::string &text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '"' || c == '\\')
      out += {'\\', char(c)};
    else if (c == '\n')
      out += "\\n";
    else if (c < 0x20)
      out += fmt::format("\\u{:04x}", c);
    else
      out += char(c);
  }
  return out;
}

std::string AttentionSpec::toJson() const {
  return fmt::format(
      "{{\"direction\":\"{}\",\"head_dim_qk\":{},\"head_dim_v\":{},"
      "\"dtype\":\"{}\",\"mask\":\"{}\",\"gqa\":{},\"block_sparse\":{},"
      "\"sparse_block\":{}{}{}{}{}{}{}}}",
      direction == Direction::Forward ? "forward" : "backward", headDimQK,
      headDimV, toString(dtype), toString(mask), gqaGroup,
      blockSparse ? "true" : "false", sparseBlock,
      varlen ? ",\"varlen\":true" : "",
      direction == Direction::Backward
          ? fmt::format(",\"deterministic\":{}", deterministic)
          : std::string(),
      direction == Direction::Backward && captureGrads
          ? fmt::format(",\"capture_grads\":{}", captureGrads)
          : std::string(),
      scoreMod.empty() ? std::string()
                       : fmt::format(",\"score_mod\":\"{}\"", scoreMod),
      scoreModRegion.empty() ? std::string()
                             : fmt::format(",\"score_mod_region\":\"{}\"",
                                           jsonEscaped(scoreModRegion)),
      maskModRegion.empty() ? std::string()
                            : fmt::format(",\"mask_mod_region\":\"{}\"",
                                          jsonEscaped(maskModRegion)));
}

std::string TileConfig::toJson() const {
  // "splits" only for a split-KV tiling ("auto": chosen at launch).
  std::string split = splits == 0 ? ""
                      : splits == kAutoSplits
                          ? ",\"splits\":\"auto\""
                          : fmt::format(",\"splits\":{}", splits);
  // "overlap_softmax", "persistent", "query_tma" and "output_tma" only when
  // set, so that other configs read as before (loadTunedConfig reads them
  // in this order).
  return fmt::format(
      "{{\"block_m\":{},\"block_n\":{},\"warps\":{},\"stages\":{}{}{}{}{}{}}}",
      blockM, blockN, warps, stages, split,
      overlapSoftmax ? ",\"overlap_softmax\":true" : "",
      persistent ? ",\"persistent\":true" : "",
      queryByTensorMap ? ",\"query_tma\":true" : "",
      outputByTensorMap ? ",\"output_tma\":true" : "");
}

/// The exact text of \p v as an f32 constant (a hex float).
static std::string f32Text(double v) {
  float f = float(v);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return fmt::format("0x{:08X}", bits);
}

// One builder per named variant: the body of its score_mod region on
// (%s: score, %b: batch, %h: head, %i: q_idx, %j: kv_idx). Each body
// begins with its argument as an f32 constant, where the reader of a
// description (FlashFwdOp::namedScoreMod) finds it again.

/// softcap:C: C * tanh(s / C).
static std::string softcapBody(const ScoreMod &mod) {
  return fmt::format("    %c = arith.constant {} : f32\n"
                     "    %x = arith.divf %s, %c : f32\n"
                     "    %t = math.tanh %x : f32\n"
                     "    %y = arith.mulf %t, %c : f32\n",
                     f32Text(mod.cap));
}

/// alibi:H: s + 2^((h + 1) * (-8 / H)) * (j - i), in f32 (the index
/// arithmetic in i32 on tiles).
static std::string alibiBody(const ScoreMod &mod) {
  return fmt::format("    %H = arith.constant {} : f32\n"
                     "    %n8 = arith.constant -8.000000e+00 : f32\n"
                     "    %k = arith.divf %n8, %H : f32\n"
                     "    %one = arith.constant 1 : index\n"
                     "    %h1 = arith.addi %h, %one : index\n"
                     "    %hi = arith.index_cast %h1 : index to i32\n"
                     "    %hf = arith.sitofp %hi : i32 to f32\n"
                     "    %e = arith.mulf %hf, %k : f32\n"
                     "    %slope = math.exp2 %e : f32\n"
                     "    %d = arith.subi %j, %i : index\n"
                     "    %di = arith.index_cast %d : index to i32\n"
                     "    %df = arith.sitofp %di : i32 to f32\n"
                     "    %bias = arith.mulf %slope, %df : f32\n"
                     "    %y = arith.addf %s, %bias : f32\n",
                     f32Text(double(mod.heads)));
}

/// The score_mod region of \p spec's named modifier (after the attribute
/// dictionary), "" for none. Its result is %y.
static std::string scoreModRegionText(const AttentionSpec &spec) {
  if (spec.scoreMod == kCustomScoreMod) {
    if (spec.scoreModRegion.empty())
      throw SpecError("score modifier 'custom' without its region (give "
                      "the region text, or an attn-stage file with --input)");
    return " score_mod " + spec.scoreModRegion;
  }
  ScoreMod mod = ScoreMod::parse(spec.scoreMod);
  if (mod.kind == ScoreMod::Kind::None)
    return "";
  return fmt::format(
      " score_mod {{\n  ^bb0(%s: f32, %b: index, %h: index, %i: index, "
      "%j: index):\n{}    attn.yield %y : f32\n  }}",
      mod.kind == ScoreMod::Kind::Softcap ? softcapBody(mod) : alibiBody(mod));
}

std::string attnModuleText(const AttentionSpec &spec, const std::string &name) {
  // The backward's `deterministic` and `capture_grads` only when set (false
  // and 0 are their defaults).
  const bool backward = spec.direction == Direction::Backward;
  return fmt::format(
      "module {{\n  attn.{} @{} {{element_type = {}, gqa = {} : i64, "
      "head_dim_qk = {} : i64, head_dim_v = {} : i64, mask = \"{}\", "
      "sparse_block = {} : i64{}{}{}}}{}\n}}\n",
      backward ? "flash_bwd" : "flash_fwd", name,
      spec.dtype == DType::BF16 ? "bf16" : "f16", spec.gqaGroup, spec.headDimQK,
      spec.headDimV, toString(spec.mask),
      spec.blockSparse ? spec.sparseBlock : 0,
      spec.varlen ? ", varlen = true" : "",
      backward && spec.deterministic ? ", deterministic = true" : "",
      backward && spec.captureGrads
          ? fmt::format(", capture_grads = {} : i64", spec.captureGrads)
          : std::string(),
      scoreModRegionText(spec) + (spec.maskModRegion.empty()
                                      ? std::string()
                                      : " mask_mod " + spec.maskModRegion));
}

} // namespace flashjit
