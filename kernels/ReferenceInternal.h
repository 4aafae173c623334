//===- ReferenceInternal.h - What the float64 references share -*- C++ -*-===//
//
/// \file
/// Internal to flashjit_kernels: the helpers that the forward's reference
/// (ReferenceForward.cpp, which defines them) and the backward's
/// (ReferenceBackward.cpp) share. Not part of HostTensor.h's API.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_KERNELS_REFERENCEINTERNAL_H
#define FLASHJIT_KERNELS_REFERENCEINTERNAL_H

#include "kernels/HostTensor.h"

#include <cstdint>
#include <vector>

namespace flashjit::detail {

/// Does query row \p i of (b, h) see key \p j? The band (\p left, \p right
/// from effectiveWindow, bottom-right aligned), then the layout if any.
bool isVisible(const AttentionSpec &spec, const Problem &p,
               const BlockSparseLayout *layout, int64_t left, int64_t right,
               int64_t b, int64_t h, int64_t i, int64_t j);

/// Up to \p count indices spread evenly over [0, n), increasing, the first
/// and the last included.
std::vector<int64_t> evenlySpaced(int64_t n, int64_t count);

} // namespace flashjit::detail

#endif // FLASHJIT_KERNELS_REFERENCEINTERNAL_H
