//===- MaskBlocksRun.h - The layout of --mask-blocks ------------*- C++ -*-===//
//
/// \file
/// `--mask-blocks` in `run` and `bench` (MaskBlocksRun.cpp).
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_TOOLS_CLI_MASKBLOCKSRUN_H
#define FLASHJIT_TOOLS_CLI_MASKBLOCKSRUN_H

#include "kernels/HostTensor.h"
#include "tools/cli/CliOptions.h"

#include <memory>
#include <string>

namespace flashjit::cli {

/// A layout the kernel classified, and what the run says of it.
struct MaskBlocksRun {
  std::unique_ptr<BlockSparseLayout> layout;
  double ms = 0;      ///< the classification's time (median on the GPU)
  double density = 0; ///< of the layout (kept when the run takes it)
  int64_t full = 0;   ///< listed entries marked full
  /// The layout's batch and heads: 1 where the mask reads neither.
  int64_t batch = 1, heads = 1;
  /// Compared with the float64 classification (`run`, small problems), and
  /// equal to it.
  bool checked = false, matches = false;
};

/// The layout of \p forwardSpec's mask_mod for the run's problem and the
/// captured tensors of \p data, classified on the GPU (\p onGpu; timed over
/// \p repeats launches) or the CPU.
MaskBlocksRun classifyMaskBlocks(const CliOptions &o,
                                 const AttentionSpec &forwardSpec,
                                 const AttentionData &data, bool onGpu,
                                 int64_t repeats);

/// `,"mask_blocks":{...}` for `--json`, and the text line.
std::string maskBlocksJson(const MaskBlocksRun &r);
std::string maskBlocksText(const MaskBlocksRun &r);

} // namespace flashjit::cli

#endif // FLASHJIT_TOOLS_CLI_MASKBLOCKSRUN_H
