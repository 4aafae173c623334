//===- BackwardCommand.h - `flashjit run --backward` ------------*- C++ -*-===//
//
/// \file
/// The CLI's backward pass: `run --backward` runs the forward on the CPU
/// (O, lse), then the tiled backward on random dO, and checks dQ, dK and dV
/// against float64 gradients. The GPU backward does not exist yet: asking
/// for it (--device cuda, bench, tune, a GPU stage) is a SpecError.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_TOOLS_CLI_BACKWARDCOMMAND_H
#define FLASHJIT_TOOLS_CLI_BACKWARDCOMMAND_H

#include "compiler/Compiler.h"
#include "tools/cli/CliOptions.h"

namespace flashjit::cli {

/// `run`, `bench` or `tune` with --backward; returns the exit code (0 ok,
/// 1 accuracy check failed); throws SpecError for what it cannot do.
int runBackward(const CliOptions &o);

/// `compile --backward`: throws the GPU backward's SpecError for a GPU stage.
void checkBackwardStage(const CliOptions &o, Stage stage);

} // namespace flashjit::cli

#endif // FLASHJIT_TOOLS_CLI_BACKWARDCOMMAND_H
