//===- MaskMods.cpp - The CLI's mask modifiers ----------------------------===//
//
/// \file
/// `--mask-mod M` (issue 14): which keys a query sees. The band masks by
/// name are the description's own (`mask = "causal"` /
/// `"sliding_window"`, whose blocks the tiling skips); a document mask and
/// any region given as text are the description's mask_mod region, so the
/// CPU mode, every GPU path and the float64 reference (which evaluates the
/// region itself) run it with no code of their own, beside any
/// --score-mod:
///
///   --mask-mod causal               --causal
///   --mask-mod sliding_window:L,R   --window L,R
///   --mask-mod document             keep where seg[i] == seg[j]; seg from
///                                   --capture FILE.npy (one id per
///                                   position, indexed by query and key
///                                   positions; after --score-mod's
///                                   captured tensors)
///   --mask-mod '{ ^bb0(...) ... }'  a mask_mod region's text
///   --mask-mod @FILE                a file that holds one
///
/// `--mask-blocks` makes the description block-sparse with the layout of
/// its mask_mod region, classified at run time by the kernel's own
/// `@f_blocks` (MaskBlocksRun.cpp).
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/HostTensor.h"
#include "tools/cli/CliOptions.h"

#include <fmt/format.h>

namespace flashjit::cli {

/// The document mask's region: keep where the query's and the key's
/// segment ids agree.
static const char *kDocumentRegion = R"({
^bb0(%b: index, %h: index, %i: index, %j: index, %seg: memref<?xf32>):
  %si = memref.load %seg[%i] : memref<?xf32>
  %sj = memref.load %seg[%j] : memref<?xf32>
  %same = arith.cmpf oeq, %si, %sj : f32
  attn.yield %same : i1
})";

void applyMaskMod(const std::string &name, CliOptions &o,
                  std::optional<std::string> &window) {
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
  std::string text = name;
  if (name == "document")
    text = kDocumentRegion;
  else if (!name.empty() && name[0] == '@')
    text = readBoundedFile(name.substr(1), "--mask-mod", 1 << 16);
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] != '{')
    throw SpecError(fmt::format("--mask-mod '{}': expected causal, "
                                "sliding_window:L,R, document, a mask_mod "
                                "region's text ('{{ ^bb0(%b: index, %h: "
                                "index, %i: index, %j: index): ... attn.yield "
                                "%keep : i1 }}') or @FILE",
                                name));
  o.spec = withMaskModRegion(o.spec, text);
}

void applyMaskBlocks(CliOptions &o) {
  if (!o.maskBlocks)
    return;
  if (o.spec.maskModRegion.empty())
    throw SpecError("--mask-blocks classifies the blocks of a mask_mod "
                    "region: give --mask-mod document, {...} or @FILE (the "
                    "tiling skips the blocks of --causal and --window "
                    "itself)");
  if (o.density || !o.layoutPath.empty())
    throw SpecError("--mask-blocks finds the layout itself: drop "
                    "--block-sparse / --layout");
  o.spec.blockSparse = true;
}

} // namespace flashjit::cli
