//===- CApiPlan.cpp - Prepared forward calls (flashjit_plan_*) ------------===//
//
/// \file
/// A flashjit_plan is a forward call with everything but its pointers done
/// once: the spec and the tensors' shapes and strides converted and
/// checked, the tile config chosen (tuned, cached or the heuristic), the
/// kernel compiled or taken from the cache and loaded, and, on CUDA, the
/// launch prepared (rt::PreparedForward: grid, block, shared memory, index
/// arguments, scale). flashjit_plan_forward then checks the pointers and
/// launches: on CUDA one cuCtxGetCurrent and one cuLaunchKernel, no
/// allocation, no string, no map lookup, no lock. A spec whose regions
/// capture tensors is planned by flashjit_plan_create_captured, which keeps
/// their sizes; each flashjit_plan_forward_captured gives their pointers.
//
//===----------------------------------------------------------------------===//

#include "CApiInternal.h"

#include <cstdint>

using namespace flashjit;
using namespace flashjit::capi;

struct flashjit_plan {
  int device = FLASHJIT_DEVICE_CPU;
  AttentionSpec spec;
  Problem problem;
  /// The tensors' shapes and strides (data null): a call's pointers go in.
  flashjit_tensor q{}, k{}, v{}, o{};
  /// Block-sparse: the layout's dimensions (counts and indices null).
  std::optional<flashjit_layout> layout;
  /// The captured tensors' sizes (elements), in the regions' order: a
  /// call's tensors must have these.
  std::vector<int64_t> captureSizes;
  /// CPU: the compiled kernel.
  std::shared_ptr<CpuKernel> cpuKernel;
  /// CUDA: the context the kernel was loaded in, the kernel (kept alive by
  /// the plan) and its prepared launch.
  CUcontext context = nullptr;
  std::shared_ptr<rt::ForwardKernel> gpuKernel;
  std::optional<rt::PreparedForward> prepared;
};

namespace {

/// \p t's shape and strides, without its data.
flashjit_tensor shapeOf(const flashjit_tensor &t) {
  flashjit_tensor s = t;
  s.data = nullptr;
  return s;
}

void requirePointer(const void *p, const char *what) {
  if (!p)
    invalid(fmt::format("{} is NULL", what));
}

/// The block-sparse pointers of a call: both for a block-sparse plan, none
/// for a dense one.
void checkLayoutPointers(bool blockSparse, const int32_t *counts,
                         const int32_t *indices) {
  if (blockSparse && (!counts || !indices))
    invalid("block_counts and block_indices must not be NULL: the plan is "
            "block-sparse");
  if (!blockSparse && (counts || indices))
    invalid("block_counts / block_indices given, but the plan is dense "
            "(pass NULL)");
}

/// Checks a call's captured tensors against the plan's: checkCaptured's
/// checks, and each of the size the plan was made for.
void checkPlannedCaptures(const flashjit_plan &plan,
                          const flashjit_captured *captured, int64_t count) {
  checkCaptured(plan.spec, captured, count, "flashjit_plan_forward_captured");
  for (int64_t c = 0; c < count; ++c)
    if (captured[c].size != plan.captureSizes[size_t(c)])
      invalid(fmt::format("captured[{}].size is {}, the plan's {} (make a "
                          "plan for this size)",
                          c, captured[c].size, plan.captureSizes[size_t(c)]));
}

void forwardPlannedCuda(const flashjit_plan &plan, const void *q, const void *k,
                        const void *v, void *o, float *lse,
                        const int32_t *counts, const int32_t *indices,
                        const flashjit_captured *captured, void *stream) {
  const rt::PreparedForward &launch = *plan.prepared;
  if (!q || !k || !v || !o || !lse) {
    requirePointer(q, "q");
    requirePointer(k, "k");
    requirePointer(v, "v");
    requirePointer(o, "o");
    invalid("lse is NULL: on CUDA the kernel always writes lse (fp32 "
            "[B, H, Nq])");
  }
  auto copy = uintptr_t(launch.copyBytes());
  auto address = [](const void *p) { return reinterpret_cast<uintptr_t>(p); };
  if ((address(q) | address(k) | address(v) | address(o)) % copy != 0)
    invalid(fmt::format("q ({}), k ({}), v ({}) and o ({}) must be {}-byte "
                        "aligned: the plan's kernel copies {} bytes at a "
                        "time (the alignment of the tensors "
                        "flashjit_plan_create saw); make a plan for these "
                        "pointers",
                        q, k, v, o, copy, copy));
  checkLayoutPointers(launch.blockSparse(), counts, indices);
  rt::ForwardBuffers b{devicePtr(q),      devicePtr(k),   devicePtr(v),
                       devicePtr(o),      devicePtr(lse), devicePtr(counts),
                       devicePtr(indices)};
  for (size_t c = 0; c < plan.captureSizes.size(); ++c)
    b.captures[c] = devicePtr(captured[c].data);
  rt::ScopedContext scope(plan.context);
  launch.launch(b, static_cast<CUstream>(stream));
}

void forwardPlannedCpu(const flashjit_plan &plan, const void *q, const void *k,
                       const void *v, void *o, float *lse,
                       const int32_t *counts, const int32_t *indices,
                       const flashjit_captured *captured) {
  requirePointer(q, "q");
  requirePointer(k, "k");
  requirePointer(v, "v");
  requirePointer(o, "o");
  checkLayoutPointers(plan.spec.blockSparse, counts, indices);
  auto with = [](flashjit_tensor t, const void *data) {
    t.data = const_cast<void *>(data);
    return t;
  };
  std::unique_ptr<BlockSparseLayout> bcsr;
  if (plan.layout) {
    flashjit_layout l = *plan.layout;
    l.counts = counts;
    l.indices = indices;
    bcsr = hostLayout(&l, plan.problem, plan.spec.sparseBlock);
  }
  runCpuForward(*plan.cpuKernel, plan.problem, with(plan.q, q), with(plan.k, k),
                with(plan.v, v), with(plan.o, o), lse, bcsr.get(),
                hostCaptures(plan.spec, captured));
}

/// flashjit_plan_create(_captured)'s body.
void createPlan(flashjit_handle *handle, const flashjit_spec *spec,
                const flashjit_tensor *q, const flashjit_tensor *k,
                const flashjit_tensor *v, const flashjit_tensor *o, float *lse,
                double scale, int64_t windowLeft, int64_t windowRight,
                const flashjit_layout *layout,
                const flashjit_captured *captured, int64_t numCaptured,
                void *cudaStream, flashjit_plan **plan) {
  if (!plan)
    invalid("plan is NULL");
  *plan = nullptr;
  requireHandle(handle);
  AttentionSpec s = toSpec(spec);
  s.direction = Direction::Forward; // the pass a plan runs
  if (s.varlen)
    invalid("spec.varlen: plans do not take variable-length batches yet; "
            "call flashjit_forward_varlen");
  Problem p = toProblem(s, q, k, v, o, scale, windowLeft, windowRight);
  checkLayoutShape(s, p, layout);
  checkCaptured(s, captured, numCaptured, "flashjit_plan_create_captured");
  auto made = std::make_unique<flashjit_plan>();
  made->device = handle->device;
  made->spec = s;
  made->problem = p;
  made->q = shapeOf(*q);
  made->k = shapeOf(*k);
  made->v = shapeOf(*v);
  made->o = shapeOf(*o);
  for (int64_t c = 0; c < numCaptured; ++c)
    made->captureSizes.push_back(captured[c].size);
  if (layout) {
    made->layout = *layout;
    made->layout->counts = made->layout->indices = nullptr;
  }
  if (handle->device == FLASHJIT_DEVICE_CPU) {
    made->cpuKernel = cpuKernel(handle, s, chooseConfig(s, p, nullptr));
  } else {
    if (!lse)
      invalid("lse is NULL: on CUDA the kernel always writes lse (fp32 "
              "[B, H, Nq])");
    auto [context, info] = currentDevice(handle);
    rt::ForwardArgs args = forwardArgs(*q, *k, *v, *o, lse, layout);
    // Tuning (at most once per spec and problem class) runs on them.
    for (int64_t c = 0; c < numCaptured; ++c)
      args.captures[size_t(c)] = devicePtr(captured[c].data);
    made->context = context;
    made->gpuKernel = forwardKernelFor(handle, s, p, context, info, args,
                                       static_cast<CUstream>(cudaStream));
    made->prepared.emplace(*made->gpuKernel, p, args,
                           static_cast<CUstream>(cudaStream));
  }
  *plan = made.release();
}

/// flashjit_plan_forward(_captured)'s body.
void runPlan(const flashjit_plan *plan, const void *q, const void *k,
             const void *v, void *o, float *lse, const int32_t *counts,
             const int32_t *indices, const flashjit_captured *captured,
             int64_t numCaptured, void *cudaStream) {
  if (!plan)
    invalid("plan is NULL");
  if (numCaptured || !plan->captureSizes.empty())
    checkPlannedCaptures(*plan, captured, numCaptured);
  if (plan->device == FLASHJIT_DEVICE_CUDA)
    forwardPlannedCuda(*plan, q, k, v, o, lse, counts, indices, captured,
                       cudaStream);
  else
    forwardPlannedCpu(*plan, q, k, v, o, lse, counts, indices, captured);
}

} // namespace

extern "C" {

FLASHJIT_API flashjit_status flashjit_plan_create(
    flashjit_handle *handle, const flashjit_spec *spec,
    const flashjit_tensor *q, const flashjit_tensor *k,
    const flashjit_tensor *v, const flashjit_tensor *o, float *lse,
    double scale, int64_t window_left, int64_t window_right,
    const flashjit_layout *layout, void *cuda_stream, flashjit_plan **plan) {
  return guarded("flashjit_plan_create", [&] {
    createPlan(handle, spec, q, k, v, o, lse, scale, window_left, window_right,
               layout, nullptr, 0, cuda_stream, plan);
  });
}

FLASHJIT_API flashjit_status flashjit_plan_create_captured(
    flashjit_handle *handle, const flashjit_spec *spec,
    const flashjit_tensor *q, const flashjit_tensor *k,
    const flashjit_tensor *v, const flashjit_tensor *o, float *lse,
    double scale, int64_t window_left, int64_t window_right,
    const flashjit_layout *layout, const flashjit_captured *captured,
    int64_t num_captured, void *cuda_stream, flashjit_plan **plan) {
  return guarded("flashjit_plan_create_captured", [&] {
    createPlan(handle, spec, q, k, v, o, lse, scale, window_left, window_right,
               layout, captured, num_captured, cuda_stream, plan);
  });
}

FLASHJIT_API flashjit_status flashjit_plan_forward(
    const flashjit_plan *plan, const void *q, const void *k, const void *v,
    void *o, float *lse, const int32_t *block_counts,
    const int32_t *block_indices, void *cuda_stream) {
  return guarded("flashjit_plan_forward", [&] {
    runPlan(plan, q, k, v, o, lse, block_counts, block_indices, nullptr, 0,
            cuda_stream);
  });
}

FLASHJIT_API flashjit_status flashjit_plan_forward_captured(
    const flashjit_plan *plan, const void *q, const void *k, const void *v,
    void *o, float *lse, const int32_t *block_counts,
    const int32_t *block_indices, const flashjit_captured *captured,
    int64_t num_captured, void *cuda_stream) {
  return guarded("flashjit_plan_forward_captured", [&] {
    runPlan(plan, q, k, v, o, lse, block_counts, block_indices, captured,
            num_captured, cuda_stream);
  });
}

FLASHJIT_API void flashjit_plan_destroy(flashjit_plan *plan) {
  try {
    delete plan;
  } catch (...) {
  }
}

} // extern "C"
