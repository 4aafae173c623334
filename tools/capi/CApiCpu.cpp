//===- CApiCpu.cpp - The C API's CPU execution mode -----------------------===//
//
/// \file
/// A CPU handle's forward and backward: the caller's strided host tensors
/// are copied into packed buffers, run by the kernels MLIR's JIT compiled
/// (cached in the handle per spec and tiling) and scattered back.
//
//===----------------------------------------------------------------------===//

#include "CApiInternal.h"
#include "tools/engine/KernelProvider.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace flashjit::capi {

//===----------------------------------------------------------------------===//
// CPU
//===----------------------------------------------------------------------===//

/// A packed host copy of a caller's strided tensor (the CPU execution mode
/// runs on HalfTensor buffers it owns).
static HalfTensor packedCopy(const flashjit_tensor &t) {
  HalfTensor h =
      HalfTensor::packed({t.shape[0], t.shape[1], t.shape[2], t.shape[3]});
  const auto *src = static_cast<const uint16_t *>(t.data);
  uint16_t *dst = h.buffer->data();
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t hh = 0; hh < t.shape[1]; ++hh)
      for (int64_t n = 0; n < t.shape[2]; ++n) {
        std::memcpy(
            dst, src + b * t.strides[0] + hh * t.strides[1] + n * t.strides[2],
            size_t(t.shape[3]) * 2);
        dst += t.shape[3];
      }
  return h;
}

static void scatterBack(const HalfTensor &h, const flashjit_tensor &t) {
  auto *dst = static_cast<uint16_t *>(t.data);
  const uint16_t *src = h.buffer->data();
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t hh = 0; hh < t.shape[1]; ++hh)
      for (int64_t n = 0; n < t.shape[2]; ++n) {
        std::memcpy(dst + b * t.strides[0] + hh * t.strides[1] +
                        n * t.strides[2],
                    src, size_t(t.shape[3]) * 2);
        src += t.shape[3];
      }
}

std::shared_ptr<CpuKernel> cpuKernel(flashjit_handle *h,
                                     const AttentionSpec &spec,
                                     const TileConfig &config) {
  std::string key = engine::loadedKernelKey(spec, config, 0, "cpu", nullptr);
  std::lock_guard<std::mutex> lock(h->mutex);
  auto it = h->cpuKernels.find(key);
  if (it != h->cpuKernels.end())
    return it->second;
  std::shared_ptr<CpuKernel> k = CpuKernel::compile(spec, config);
  h->cpuKernels.emplace(key, k);
  return k;
}

/// A CPU call's layout: host memory.
std::unique_ptr<BlockSparseLayout> hostLayout(const flashjit_layout *layout,
                                              const Problem &p,
                                              int64_t sparseBlock) {
  return hostLayout(layout, p, sparseBlock,
                    [](int32_t *dst, const int32_t *src, size_t n) {
                      std::copy(src, src + n, dst);
                    });
}

/// \p varlen's offsets (host memory) into \p d (checked by the kernel's
/// run: kernels/HostTensor.h checkVarlenData).
static void setOffsets(AttentionData &d, const Problem &p,
                       const flashjit_varlen *varlen) {
  if (!varlen)
    return;
  d.cuSeqQ.assign(varlen->cu_seqlens_q, varlen->cu_seqlens_q + p.batch + 1);
  d.cuSeqKV.assign(varlen->cu_seqlens_kv, varlen->cu_seqlens_kv + p.batch + 1);
}

void runCpuForward(const CpuKernel &kernel, const Problem &p,
                   const flashjit_tensor &q, const flashjit_tensor &k,
                   const flashjit_tensor &v, const flashjit_tensor &o,
                   float *lse, const BlockSparseLayout *bcsr, Captures captures,
                   const flashjit_varlen *varlen) {
  AttentionData d;
  d.captures = std::move(captures);
  setOffsets(d, p, varlen);
  d.q = packedCopy(q);
  d.k = packedCopy(k);
  d.v = packedCopy(v);
  d.o = HalfTensor::packed({o.shape[0], o.shape[1], o.shape[2], o.shape[3]});
  d.lse.assign(size_t(p.batch * p.heads * p.seqLenQ), 0.0f);
  kernel.run(p, d, bcsr);
  scatterBack(d.o, o);
  if (lse)
    std::memcpy(lse, d.lse.data(), d.lse.size() * sizeof(float));
}

void forwardCpu(flashjit_handle *h, const AttentionSpec &spec, const Problem &p,
                const flashjit_tensor &q, const flashjit_tensor &k,
                const flashjit_tensor &v, const flashjit_tensor &o, float *lse,
                const flashjit_layout *layout,
                const flashjit_captured *captured,
                const flashjit_varlen *varlen) {
  std::unique_ptr<BlockSparseLayout> bcsr =
      hostLayout(layout, p, spec.sparseBlock);
  std::shared_ptr<CpuKernel> kernel =
      cpuKernel(h, spec, chooseConfig(spec, p, nullptr));
  runCpuForward(*kernel, p, q, k, v, o, lse, bcsr.get(),
                hostCaptures(spec, captured), varlen);
}

void maskBlocksCpu(flashjit_handle *h, const AttentionSpec &spec,
                   const Problem &p, const flashjit_layout &layout,
                   const flashjit_captured *captured,
                   const flashjit_varlen *varlen) {
  AttentionData d;
  d.captures = hostCaptures(spec, captured);
  if (varlen) { // checked by classifyBlocks
    d.cuSeqQ.assign(varlen->cu_seqlens_q, varlen->cu_seqlens_q + p.batch + 1);
    d.cuSeqKV.assign(varlen->cu_seqlens_kv,
                     varlen->cu_seqlens_kv + p.batch + 1);
  }
  BlockSparseLayout l = cpuKernel(h, spec, chooseConfig(spec, p, nullptr))
                            ->classifyBlocks(p, d, layout.batch, layout.heads);
  // Only the listed entries: the others stay as the caller left them.
  std::copy(l.counts.begin(), l.counts.end(),
            const_cast<int32_t *>(layout.counts));
  int32_t *indices = const_cast<int32_t *>(layout.indices);
  for (size_t row = 0; row < l.counts.size(); ++row)
    std::copy_n(l.indices.begin() + std::ptrdiff_t(row * l.kvBlocks),
                l.counts[row], indices + row * size_t(l.kvBlocks));
}

Captures hostCaptures(const AttentionSpec &spec,
                      const flashjit_captured *captured) {
  Captures out;
  for (int64_t c = 0; c < spec.captures; ++c)
    out.emplace_back(captured[c].data, captured[c].data + captured[c].size);
  return out;
}

/// Throws unless \p kvLayout (host memory, its shape checked) lists what
/// \p bcsr.transposed() lists: each row's count and its entries up to it.
static void checkKvMajor(const BlockSparseLayout &bcsr,
                         const flashjit_layout &kvLayout) {
  BlockSparseLayout t = bcsr.transposed();
  auto cs = t.countStrides();
  auto is = t.indexStrides();
  for (int64_t b = 0; b < t.batch; ++b)
    for (int64_t h = 0; h < t.heads; ++h)
      for (int64_t kb = 0; kb < t.qBlocks; ++kb) {
        int64_t c = b * cs[0] + h * cs[1] + kb * cs[2];
        int64_t i = b * is[0] + h * is[1] + kb * is[2];
        int32_t n = t.counts[size_t(c)];
        auto where = [&](const std::string &what) {
          invalid(fmt::format("kv_layout is not the layout's KV-major "
                              "transpose: batch {}, head {}, KV block {}: {}",
                              b, h, kb, what));
        };
        if (kvLayout.counts[c] != n)
          where(fmt::format("count {}, the transpose has {}",
                            kvLayout.counts[c], n));
        for (int32_t j = 0; j < n; ++j)
          if (kvLayout.indices[i + j] != t.indices[size_t(i + j)])
            where(fmt::format("entry {} is {}, the transpose has {} (~qb "
                              "marks a full pair)",
                              j, kvLayout.indices[i + j],
                              t.indices[size_t(i + j)]));
      }
}

/// The backward on the CPU: dq, dk, dv from q, k, v, the forward's o and
/// lse, and d_o (dQ in the spec's mode; the kernel's own workspace).
void backwardCpu(flashjit_handle *h, const AttentionSpec &forwardSpec,
                 const Problem &p, const flashjit_tensor &q,
                 const flashjit_tensor &k, const flashjit_tensor &v,
                 const flashjit_tensor &o, const flashjit_tensor &dO,
                 const float *lse, const flashjit_tensor &dq,
                 const flashjit_tensor &dk, const flashjit_tensor &dv,
                 const flashjit_layout *layout, const flashjit_layout *kvLayout,
                 const flashjit_captured *captured,
                 const flashjit_varlen *varlen) {
  std::unique_ptr<BlockSparseLayout> bcsr =
      hostLayout(layout, p, forwardSpec.sparseBlock);
  if (kvLayout)
    checkKvMajor(*bcsr, *kvLayout);
  AttentionSpec spec = forwardSpec;
  spec.direction = Direction::Backward;
  TileConfig config = chooseConfig(spec, p, nullptr);
  std::shared_ptr<CpuBackwardKernel> kernel;
  {
    std::string key = engine::loadedKernelKey(spec, config, 0, "cpu", nullptr);
    std::lock_guard<std::mutex> lock(h->mutex);
    auto it = h->cpuBwdKernels.find(key);
    if (it == h->cpuBwdKernels.end())
      it = h->cpuBwdKernels
               .emplace(key, CpuBackwardKernel::compile(spec, config))
               .first;
    kernel = it->second;
  }
  AttentionData fwd;
  fwd.q = packedCopy(q);
  fwd.k = packedCopy(k);
  fwd.v = packedCopy(v);
  fwd.o = packedCopy(o);
  fwd.lse.assign(lse, lse + p.batch * p.heads * p.seqLenQ);
  fwd.captures = hostCaptures(forwardSpec, captured);
  setOffsets(fwd, p, varlen);
  checkVarlenData(forwardSpec, p, fwd);
  // A NaN (or +inf) lse is no forward's output; the kernel would read it as
  // a row that sees no key and give that row a zero dQ. Refused instead
  // (varlen: the rows of each sequence; the padding is never read).
  for (size_t i = 0; i < fwd.lse.size(); ++i)
    if (std::isnan(fwd.lse[i]) || fwd.lse[i] == INFINITY) {
      int64_t row = int64_t(i) % p.seqLenQ, bh = int64_t(i) / p.seqLenQ;
      if (varlen && row >= fwd.cuSeqQ[size_t(bh / p.heads + 1)] -
                               fwd.cuSeqQ[size_t(bh / p.heads)])
        continue;
      invalid(fmt::format("lse[{}, {}, {}] is {}: the forward's lse is "
                          "finite, or -inf for a row that sees no key",
                          bh / p.heads, bh % p.heads, row, fwd.lse[i]));
    }
  AttentionGrads g;
  g.dO = packedCopy(dO);
  g.dq = HalfTensor::packed({q.shape[0], q.shape[1], q.shape[2], q.shape[3]});
  g.dk = HalfTensor::packed({k.shape[0], k.shape[1], k.shape[2], k.shape[3]});
  g.dv = HalfTensor::packed({v.shape[0], v.shape[1], v.shape[2], v.shape[3]});
  // The captured tensors' gradients: the kernel's into zeros, then added
  // into the caller's (as the GPU's atomic adds do).
  if (spec.captureGrads)
    for (int64_t c = 0; c < spec.captures; ++c)
      g.captureGrads.push_back(
          std::vector<float>(captured[c].grad ? size_t(captured[c].size) : 0));
  kernel->run(p, fwd, g, bcsr.get());
  scatterBack(g.dq, dq);
  scatterBack(g.dk, dk);
  scatterBack(g.dv, dv);
  for (size_t c = 0; c < g.captureGrads.size(); ++c)
    for (size_t i = 0; i < g.captureGrads[c].size(); ++i)
      captured[c].grad[i] += g.captureGrads[c][i];
}

} // namespace flashjit::capi
