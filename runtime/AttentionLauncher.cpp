//===- AttentionLauncher.cpp - Launch a compiled forward kernel -----------===//

#include "runtime/AttentionLauncher.h"
#include "kernels/KernelABI.h"
#include "runtime/Error.h"

#include <cmath>
#include <fmt/format.h>

namespace flashjit::rt {

int64_t chooseCopyBytes(const ForwardArgs &args) {
  for (int64_t bytes : {16, 8, 4}) {
    bool ok = true;
    for (const DeviceTensor *t : {&args.q, &args.k, &args.v}) {
      ok &= t->ptr % bytes == 0;
      for (int i = 0; i < 3; ++i)
        ok &= (t->strides[i] * 2) % bytes == 0;
    }
    if (ok)
      return bytes;
  }
  return 2;
}

void checkDeviceTensors(std::initializer_list<const DeviceTensor *> tensors,
                        int64_t compiledCopy, int64_t allowedCopy) {
  for (const DeviceTensor *t : tensors)
    if (t->strides[3] != 1)
      throw SpecError(fmt::format(
          "the innermost (head-dim) stride must be 1, got {}", t->strides[3]));
  if (allowedCopy < compiledCopy)
    throw SpecError(
        fmt::format("kernel compiled for {}-byte copies, the tensors allow {}",
                    compiledCopy, allowedCopy));
}

const KernelLaunch &recordedLaunch(const KernelImage &image,
                                   const std::string &name) {
  if (const KernelLaunch *k = findKernelLaunch(image.kernels, name))
    return *k;
  throw RuntimeError(ErrorCode::InvalidArgument,
                     fmt::format("the compiled image records no launch "
                                 "resources for kernel '{}'",
                                 name));
}

void launchRecorded(CUfunction function, const KernelLaunch &launch,
                    const Problem &p, int64_t gqa, CUstream stream,
                    void **params) {
  std::array<int64_t, 3> grid = launch.grid(p, gqa);
  if (grid[1] > 65535)
    throw SpecError(
        fmt::format("batch * heads = {} exceeds the grid's 65535", grid[1]));
  rt::launch(function,
             Dim3{unsigned(grid[0]), unsigned(grid[1]), unsigned(grid[2])},
             Dim3{unsigned(launch.threads), 1, 1}, unsigned(launch.sharedBytes),
             stream, params);
}

ForwardKernel::ForwardKernel(const KernelImage &image,
                             const AttentionSpec &spec, int64_t copyBytes)
    : module(image.cubin), spec(spec),
      launchOf(recordedLaunch(image, "attention")), copy(copyBytes) {
  function = module.function("attention");
}

PreparedForward::PreparedForward(const ForwardKernel &kernel, const Problem &p,
                                 const ForwardArgs &a)
    : function(kernel.cuFunction()), copy(kernel.copyBytes()),
      sparse(kernel.attentionSpec().blockSparse) {
  const AttentionSpec &spec = kernel.attentionSpec();
  p.validate(spec);
  checkDeviceTensors({&a.q, &a.k, &a.v, &a.o}, copy, chooseCopyBytes(a));
  if (sparse && (!a.counts || !a.indices))
    throw SpecError("a block-sparse kernel needs a layout");

  abi::TensorStrides strides;
  strides.q = a.q.strides;
  strides.k = a.k.strides;
  strides.v = a.v.strides;
  strides.o = a.o.strides;
  strides.counts = a.countStrides;
  strides.indices = a.indexStrides;
  index = abi::indexArgs(spec, p, strides);
  scaleLog2 = float(p.effectiveScale(spec) / std::log(2.0));

  const KernelLaunch &launch = kernel.recorded();
  std::array<int64_t, 3> grid = launch.grid(p, spec.gqaGroup);
  if (grid[1] > 65535)
    throw SpecError(
        fmt::format("batch * heads = {} exceeds the grid's 65535", grid[1]));
  gridDim = Dim3{unsigned(grid[0]), unsigned(grid[1]), unsigned(grid[2])};
  blockDim = Dim3{unsigned(launch.threads), 1, 1};
  shared = unsigned(launch.sharedBytes);
  if (!function || !gridDim.x || !gridDim.z || !blockDim.x)
    throw RuntimeError(ErrorCode::InvalidArgument,
                       "PreparedForward: an empty launch");
  allowSharedBytes(function, shared);
}

void PreparedForward::launch(const ForwardBuffers &b, CUstream stream) const {
  CUdeviceptr bufs[abi::NumBuffers] = {b.q,   b.k,      b.v,      b.o,
                                       b.lse, b.counts, b.indices};
  // Dense kernels never read the layout; give them a valid pointer anyway.
  if (!sparse)
    bufs[abi::Counts] = bufs[abi::Indices] = b.q;
  void *params[abi::NumBuffers + abi::NumIndexArgs + 1];
  int n = 0;
  for (CUdeviceptr &ptr : bufs)
    params[n++] = &ptr;
  for (int64_t &value : index)
    params[n++] = &value;
  params[n++] = &scaleLog2;
  launchKernel(function, gridDim, blockDim, shared, stream, params);
}

void ForwardKernel::launch(const Problem &p, const ForwardArgs &a,
                           CUstream stream) const {
  PreparedForward prepared(*this, p, a);
  CudaDriver::get().ensureContext();
  ForwardBuffers b{a.q.ptr, a.k.ptr,  a.v.ptr,  a.o.ptr,
                   a.lse,   a.counts, a.indices};
  // As ever: a null buffer (a dense kernel's layout) points at q.
  for (CUdeviceptr *ptr : {&b.lse, &b.counts, &b.indices})
    if (!*ptr)
      *ptr = b.q;
  prepared.launch(b, stream);
}

} // namespace flashjit::rt
