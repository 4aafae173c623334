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
/// allocation, no string, no map lookup, no lock.
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

void forwardPlannedCuda(const flashjit_plan &plan, const void *q, const void *k,
                        const void *v, void *o, float *lse,
                        const int32_t *counts, const int32_t *indices,
                        void *stream) {
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
  rt::ScopedContext scope(plan.context);
  launch.launch(b, static_cast<CUstream>(stream));
}

void forwardPlannedCpu(const flashjit_plan &plan, const void *q, const void *k,
                       const void *v, void *o, float *lse,
                       const int32_t *counts, const int32_t *indices) {
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
                with(plan.v, v), with(plan.o, o), lse, bcsr.get());
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
    if (!plan)
      invalid("plan is NULL");
    *plan = nullptr;
    requireHandle(handle);
    AttentionSpec s = toSpec(spec);
    s.direction = Direction::Forward; // the pass a plan runs
    if (s.varlen)
      invalid("spec.varlen: plans do not take variable-length batches yet; "
              "call flashjit_forward_varlen");
    Problem p = toProblem(s, q, k, v, o, scale, window_left, window_right);
    checkLayoutShape(s, p, layout);
    if (s.captures > 0)
      invalid(fmt::format("spec.score_mod / spec.mask_mod capture {} tensors: "
                          "plans do not "
                          "take captured tensors yet; call "
                          "flashjit_forward_captured",
                          s.captures));
    auto made = std::make_unique<flashjit_plan>();
    made->device = handle->device;
    made->spec = s;
    made->problem = p;
    made->q = shapeOf(*q);
    made->k = shapeOf(*k);
    made->v = shapeOf(*v);
    made->o = shapeOf(*o);
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
      made->context = context;
      made->gpuKernel = forwardKernelFor(handle, s, p, context, info, args,
                                         static_cast<CUstream>(cuda_stream));
      made->prepared.emplace(*made->gpuKernel, p, args);
    }
    *plan = made.release();
  });
}

FLASHJIT_API flashjit_status flashjit_plan_forward(
    const flashjit_plan *plan, const void *q, const void *k, const void *v,
    void *o, float *lse, const int32_t *block_counts,
    const int32_t *block_indices, void *cuda_stream) {
  return guarded("flashjit_plan_forward", [&] {
    if (!plan)
      invalid("plan is NULL");
    if (plan->device == FLASHJIT_DEVICE_CUDA)
      forwardPlannedCuda(*plan, q, k, v, o, lse, block_counts, block_indices,
                         cuda_stream);
    else
      forwardPlannedCpu(*plan, q, k, v, o, lse, block_counts, block_indices);
  });
}

FLASHJIT_API void flashjit_plan_destroy(flashjit_plan *plan) {
  try {
    delete plan;
  } catch (...) {
  }
}

} // extern "C"
