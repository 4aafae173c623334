//===- BackwardCommand.h - `flashjit run --backward` ------------*- C++ -*-===//
//
/// \file
/// The CLI's backward pass: `run --backward` runs the forward (O, lse), then
/// the backward on random dO, on the CPU (the tiled backward, interpreter
/// mode) or on the GPU (the forward kernel, then the backward's three
/// kernels on poisoned gradients), and checks dQ, dK and dV against float64
/// gradients. `bench --backward` times the GPU backward alone, `tune
/// --backward` tunes its tiling and stores the winner.
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

} // namespace flashjit::cli

#endif // FLASHJIT_TOOLS_CLI_BACKWARDCOMMAND_H
