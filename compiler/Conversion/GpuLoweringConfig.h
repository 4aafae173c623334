//===- GpuLoweringConfig.h - The GPU lowering's knobs -----------*- C++ -*-===//
//
/// \file
/// GpuLoweringConfig: the knobs of flashjit-lower-tiled-to-gpu as the C++
/// builders take them (Compiler.cpp decides them per target; the pipelines
/// and the pass read them from their options). Each field is one line of
/// GpuLoweringKnobs.def, which documents it.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_CONVERSION_GPULOWERINGCONFIG_H
#define FLASHJIT_COMPILER_CONVERSION_GPULOWERINGCONFIG_H

#include <cstdint>

namespace flashjit {

/// The GPU lowering's knobs besides the warps (a TileConfig's): global ->
/// shared copy width, vector atomics, warpgroup MMAs, the forward's K/V ring
/// and its placement (ping-pong, persistent, TMA, staged stores, exp2
/// emulation) and the backward's bulk dQ and Q/dO ring; see
/// GpuLoweringKnobs.def.
struct GpuLoweringConfig {
#define FLASHJIT_GPU_KNOB(Type, Name, Flag, Default, Description)             \
  Type Name = Default;
#include "compiler/Conversion/GpuLoweringKnobs.def"
};

} // namespace flashjit

#endif // FLASHJIT_COMPILER_CONVERSION_GPULOWERINGCONFIG_H
