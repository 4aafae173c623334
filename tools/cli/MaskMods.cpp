//===- MaskMods.cpp - The CLI's named mask modifiers ----------------------===//
//
/// \file
/// `--mask-mod NAME` (issue 14): which keys a query sees, by name. The
/// band masks are the description's own (`mask = "causal"` /
/// `"sliding_window"`, whose blocks the tiling skips); a document mask is
/// a score_mod region that reads a captured tensor of segment ids, so the
/// CPU mode, every GPU path and the float64 reference (which evaluates the
/// region itself) run it with no code of its own:
///
///   --mask-mod causal               --causal
///   --mask-mod sliding_window:L,R   --window L,R
///   --mask-mod document             score = s where seg[i] == seg[j],
///                                   -inf elsewhere; seg from --capture
///                                   FILE.npy (one id per position,
///                                   indexed by query and key positions)
//
//===----------------------------------------------------------------------===//

#include "tools/cli/CliOptions.h"

#include <fmt/format.h>

namespace flashjit::cli {

/// The document mask's region: s where the query's and the key's segment
/// ids agree, -inf elsewhere.
static const char *kDocumentRegion = R"({
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index, %seg: memref<?xf32>):
  %si = memref.load %seg[%i] : memref<?xf32>
  %sj = memref.load %seg[%j] : memref<?xf32>
  %same = arith.cmpf oeq, %si, %sj : f32
  %ninf = arith.constant 0xFF800000 : f32
  %y = arith.select %same, %s, %ninf : f32
  attn.yield %y : f32
})";

void applyMaskMod(const std::string &name, CliOptions &o,
                  std::optional<std::string> &window,
                  std::optional<std::string> &scoreModArg) {
  const std::string kWindow = "sliding_window:";
  if (name == "causal") {
    if (window)
      throw SpecError("--mask-mod causal and --window are exclusive (causal "
                      "is --window inf,0)");
    o.spec.mask = MaskKind::Causal;
    return;
  }
  if (name.rfind(kWindow, 0) == 0) {
    if (window || o.spec.mask == MaskKind::Causal)
      throw SpecError(fmt::format("--mask-mod {}: give the window once (not "
                                  "with --window or --causal)",
                                  name));
    window = name.substr(kWindow.size());
    return;
  }
  if (name == "document") {
    if (scoreModArg)
      throw SpecError("--mask-mod document with --score-mod: a document mask "
                      "is a score_mod region of its own; write one region "
                      "that does both (--score-mod {...} reading the segment "
                      "ids)");
    scoreModArg = kDocumentRegion;
    return;
  }
  throw SpecError(fmt::format("--mask-mod '{}': expected causal, "
                              "sliding_window:L,R or document",
                              name));
}

} // namespace flashjit::cli
