//===- BackwardLauncher.cpp - Launch the compiled GPU backward ------------===//

#include "runtime/BackwardLauncher.h"
#include "kernels/KernelABI.h"
#include "runtime/Error.h"

#include <cmath>
#include <fmt/format.h>

namespace flashjit::rt {

int64_t chooseCopyBytes(const BackwardArgs &args) {
  ForwardArgs tiles;
  tiles.q = args.q;
  tiles.k = args.k;
  tiles.v = args.v;
  int64_t bytes = chooseCopyBytes(tiles);
  tiles.q = args.dO;
  return std::min(bytes, chooseCopyBytes(tiles));
}

BackwardKernel::BackwardKernel(const KernelImage &image,
                               const AttentionSpec &spec, int64_t copyBytes)
    : module(image.cubin),
      preprocessLaunch(recordedLaunch(
          image, std::string("attention") + abi::bwd::kPreprocessSuffix)),
      mainLaunch(recordedLaunch(image, "attention")),
      dqLaunch(recordedLaunch(image,
                              std::string("attention") + abi::bwd::kDqSuffix)),
      spec(spec), copy(copyBytes) {
  preprocess = module.function(preprocessLaunch.name);
  main = module.function(mainLaunch.name);
  dq = module.function(dqLaunch.name);
  // The dK/dV kernel's tensor maps: at most kMaxTensorMaps, each in the
  // backward's ABI (the launch below reads its indices there).
  bool backwardMaps = mainLaunch.tensorMaps.size() <= kMaxTensorMaps;
  for (const TensorMapRecord &m : mainLaunch.tensorMaps)
    backwardMaps &= m.backward;
  if (!backwardMaps)
    throw RuntimeError(ErrorCode::InvalidArgument,
                       fmt::format("the backward kernel records {} tensor "
                                   "maps; the launcher takes at most {}, "
                                   "each in the backward's ABI",
                                   mainLaunch.tensorMaps.size(),
                                   kMaxTensorMaps));
  for (int64_t c = 0;
       abi::bwd::fixedPointCaptureGrads(spec) && c < spec.captures; ++c) {
    if (!((spec.captureGrads >> c) & 1))
      continue;
    const std::string name = std::string("attention") +
                             abi::bwd::kCaptureGradSuffix + std::to_string(c);
    captureConvertLaunch = recordedLaunch(image, name);
    captureConvert[size_t(c)] = module.function(name);
  }
}

void BackwardKernel::launch(const Problem &p, const BackwardArgs &a,
                            CUstream stream) const {
  namespace bwd = abi::bwd;
  p.validate(spec);
  checkDeviceTensors({&a.q, &a.k, &a.v, &a.o, &a.dO, &a.dq, &a.dk, &a.dv}, copy,
                     chooseCopyBytes(a));
  if (!a.lse || !a.delta)
    throw SpecError("the backward needs the forward's lse and a workspace");
  if (spec.blockSparse &&
      (!a.counts || !a.indices || !a.kvCounts || !a.kvIndices))
    throw SpecError("a block-sparse backward needs the layout and its "
                    "transpose");
  checkSeqOffsetPointers(spec, a.cuSeqQ, a.cuSeqKV);

  bwd::BackwardStrides strides =
      bwd::tensorStrides(a.q, a.k, a.v, a.o, a.dO, a.dq, a.dk, a.dv);
  strides.counts = a.countStrides;
  strides.indices = a.indexStrides;
  strides.kvCounts = a.kvCountStrides;
  strides.kvIndices = a.kvIndexStrides;
  auto idx = bwd::indexArgs(spec, p, strides);
  double scale = p.effectiveScale(spec);
  float f32s[bwd::NumF32Args];
  f32s[bwd::ScaleLog2e] = float(scale / std::log(2.0));
  f32s[bwd::Scale] = float(scale);

  CUdeviceptr bufs[bwd::NumBuffers] = {};
  bufs[bwd::Q] = a.q.ptr;
  bufs[bwd::K] = a.k.ptr;
  bufs[bwd::V] = a.v.ptr;
  bufs[bwd::O] = a.o.ptr;
  bufs[bwd::DO] = a.dO.ptr;
  bufs[bwd::Lse] = a.lse;
  bufs[bwd::Delta] = a.delta;
  bufs[bwd::DQ] = a.dq.ptr;
  bufs[bwd::DK] = a.dk.ptr;
  bufs[bwd::DV] = a.dv.ptr;
  bufs[bwd::Counts] = a.counts;
  bufs[bwd::Indices] = a.indices;
  bufs[bwd::KvCounts] = a.kvCounts;
  bufs[bwd::KvIndices] = a.kvIndices;
  bufs[bwd::CuSeqQ] = a.cuSeqQ;
  bufs[bwd::CuSeqKV] = a.cuSeqKV;
  // dq_accum (atomic dQ) follows delta's 2 * B * H * Nq floats, from the
  // next 16-byte boundary (abi::bwd::dqAccumOffsetBytes).
  if (dqAccumulation(spec) == DqAccumulation::Atomic)
    bufs[bwd::DqAccum] =
        a.delta +
        CUdeviceptr(bwd::dqAccumOffsetBytes(p.batch * p.heads * p.seqLenQ));
  // Buffers a kernel never reads (dq_accum of the separate dQ pass, a dense
  // kernel's layout) get a valid pointer anyway.
  for (CUdeviceptr &b : bufs)
    if (!b)
      b = a.q.ptr;
  // The captured tensors, then a gradient buffer each (a valid pointer the
  // kernel never touches where captureGrads does not name it).
  std::array<CUdeviceptr, 2 * abi::kMaxCaptures> captured{};
  for (int64_t c = 0; c < spec.captures; ++c) {
    const bool grad = (spec.captureGrads >> c) & 1;
    captured[size_t(c)] = a.captures[size_t(c)];
    captured[size_t(spec.captures + c)] =
        grad ? a.captureGrads[size_t(c)] : a.captures[size_t(c)];
    if (!captured[size_t(c)] || !captured[size_t(spec.captures + c)])
      throw SpecError(fmt::format("the score modifier captures {} tensors; "
                                  "captured tensor {}{} is null",
                                  spec.captures, c,
                                  grad ? " or its gradient" : ""));
  }
  // Deterministic: each one's hi and lo words (zeroed here), then every
  // captured tensor's size.
  const bool fixedPoint = bwd::fixedPointCaptureGrads(spec);
  std::array<CUdeviceptr, 2 * abi::kMaxCaptures> words{};
  std::array<int64_t, abi::kMaxCaptures> sizes = a.captureSizes;
  if (fixedPoint) {
    bwd::CaptureWordLayout l = bwd::captureWordLayout(spec, sizes.data());
    if (!a.captureWords)
      throw SpecError("deterministic captured gradients need a workspace "
                      "for their fixed-point words (captureWords)");
    zeroAsync(a.captureWords, size_t(l.bytes), stream);
    for (int64_t c = 0; c < spec.captures; ++c) {
      const bool grad = (spec.captureGrads >> c) & 1;
      if (grad && (sizes[size_t(c)] < 1 || sizes[size_t(c)] > INT32_MAX))
        throw SpecError(fmt::format("captured tensor {} has {} elements; its "
                                    "gradient takes 1 .. 2^31 - 1",
                                    c, sizes[size_t(c)]));
      CUdeviceptr hi = grad ? a.captureWords + CUdeviceptr(l.hi[size_t(c)])
                            : a.captures[size_t(c)];
      words[size_t(2 * c)] = hi;
      words[size_t(2 * c + 1)] =
          grad ? hi + CUdeviceptr(8 * bwd::captureWords(sizes[size_t(c)])) : hi;
    }
  }
  void *params[bwd::NumBuffers + bwd::NumIndexArgs + bwd::NumF32Args +
               5 * abi::kMaxCaptures + kMaxTensorMaps];
  int n = 0;
  for (CUdeviceptr &b : bufs)
    params[n++] = &b;
  for (int64_t &v : idx)
    params[n++] = &v;
  for (float &f : f32s)
    params[n++] = &f;
  for (int64_t c = 0; c < 2 * spec.captures; ++c)
    params[n++] = &captured[size_t(c)];
  for (int64_t c = 0; fixedPoint && c < 2 * spec.captures; ++c)
    params[n++] = &words[size_t(c)];
  for (int64_t c = 0; fixedPoint && c < spec.captures; ++c)
    params[n++] = &sizes[size_t(c)];
  // The dK/dV kernel's tensor maps (its Q/dO ring by the TMA), its last
  // parameters; the other kernels take fewer and read none of them.
  TensorMap maps[kMaxTensorMaps];
  for (size_t i = 0; i < mainLaunch.tensorMaps.size(); ++i) {
    const TensorMapRecord &m = mainLaunch.tensorMaps[i];
    encodeRecordedMap(maps[i], m, bufs[m.buffer], idx.data(),
                      idx[bwd::Batch] * idx[bwd::Heads],
                      spec.dtype == DType::BF16);
    params[n++] = &maps[i];
  }

  for (auto [fn, launch] : {std::pair{preprocess, &preprocessLaunch},
                            {main, &mainLaunch},
                            {dq, &dqLaunch}})
    launchRecorded(fn, *launch, p, spec.gqaGroup, stream, params);
  // The conversions: grid.x is the program count (recorded rows 1).
  for (int64_t c = 0; c < spec.captures; ++c)
    if (CUfunction fn = captureConvert[size_t(c)]) {
      Problem programs;
      programs.batch = programs.heads = 1;
      programs.seqLenQ = programs.seqLenKV =
          bwd::captureConvertPrograms(sizes[size_t(c)]);
      launchRecorded(fn, captureConvertLaunch, programs, 1, stream, params);
    }
}

} // namespace flashjit::rt
