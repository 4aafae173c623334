//===- AttentionLauncher.cpp - Launch a compiled forward kernel -----------===//

#include "runtime/AttentionLauncher.h"
#include "kernels/HostTensor.h"
#include "kernels/KernelABI.h"
#include "kernels/TileSchedule.h"
#include "runtime/Error.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>

namespace flashjit::rt {

int64_t chooseCopyBytes(const ForwardArgs &args) {
  for (int64_t bytes : {16, 8, 4}) {
    bool ok = true;
    for (const DeviceTensor *t : {&args.q, &args.k, &args.v, &args.o}) {
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

void checkSeqOffsetPointers(const AttentionSpec &spec, CUdeviceptr cuSeqQ,
                            CUdeviceptr cuSeqKV) {
  if (spec.varlen && (!cuSeqQ || !cuSeqKV))
    throw SpecError("a varlen kernel needs cu_seqlens_q and cu_seqlens_kv "
                    "(the sequences' offsets)");
  if (!spec.varlen && (cuSeqQ || cuSeqKV))
    throw SpecError("cu_seqlens given to a kernel compiled without varlen");
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
                             const AttentionSpec &spec, int64_t copyBytes,
                             const TileConfig &config)
    : module(image.cubin), spec(spec),
      launchOf(recordedLaunch(image, "attention")), copy(copyBytes),
      config(config) {
  function = module.function("attention");
  if (launchOf.kvSplit) {
    const std::string combineName =
        std::string("attention") + abi::split::kCombineSuffix;
    // The recorded rows are the kernel's Br, whatever the caller's config.
    this->config.blockM = launchOf.rows;
    combineOf = recordedLaunch(image, combineName);
    combine = module.function(combineName);
  }
  const std::string blocksName =
      std::string("attention") + abi::blocks::kSuffix;
  if (findKernelLaunch(image.kernels, blocksName)) {
    const std::string listName =
        std::string("attention") + abi::blocks::kListSuffix;
    blocksOf = recordedLaunch(image, blocksName);
    blocks = module.function(blocksName);
    blockListsOf = recordedLaunch(image, listName);
    blockLists = module.function(listName);
  }
  if (launchOf.kvSplit || launchOf.persistent) {
    CudaDriver &driver = CudaDriver::get();
    DeviceInfo info = queryDevice(driver.currentDevice(), driver);
    smCount = info.smCount;
    l2Bytes = info.l2CacheBytes;
  }
}

std::shared_ptr<DeviceBuffer>
ForwardKernel::tileSchedule(const Problem &p, int64_t programs,
                            CUstream stream) const {
  // On by default since T33 (H100: causal persistent 1.16x / 1.41x the
  // stride, even with one tile per program); FLASHJIT_TILE_SCHEDULE=0
  // keeps the stride.
  const char *env = std::getenv("FLASHJIT_TILE_SCHEDULE");
  if (!launchOf.scheduled || (env && std::string(env) == "0"))
    return nullptr;
  const int64_t blocks = ceilDiv(p.seqLenQ, launchOf.rows);
  const int64_t heads = p.batch * p.heads;
  if (blocks * heads > (int64_t(1) << 22) || programs < 1)
    return nullptr;
  const std::array<int64_t, 4> key = {heads, p.seqLenQ, p.seqLenKV, programs};
  std::lock_guard<std::mutex> lock(scheduleMutex);
  auto found = schedules.find(key);
  if (found != schedules.end())
    return found->second;
  if (stream && isStreamCapturing(stream))
    return nullptr;
  // A tile's fixed part (prologue, epilogue) as half a KV block, as
  // tools/scripts/tile-order-model.py models it.
  const int64_t blockN = config.blockN > 0 ? config.blockN : launchOf.rows;
  std::vector<double> costs =
      causalBlockCosts(p.seqLenQ, p.seqLenKV, launchOf.rows, blockN, 0.5);
  const int64_t l2 = l2Bytes > 0 ? l2Bytes : int64_t(50) << 20;
  TileSchedule s = scheduleTiles(costs, heads, programs,
                                 l2GroupHeads(p.seqLenKV, spec.headDimQK,
                                              spec.headDimV, spec.gqaGroup,
                                              /*elementBytes=*/2, l2 / 2));
  auto buffer = std::make_shared<DeviceBuffer>(s.words.size() * 4);
  buffer->uploadVector(s.words);
  if (schedules.size() >= 64) // holders keep theirs
    schedules.clear();
  schedules.emplace(key, buffer);
  return buffer;
}

int64_t ForwardKernel::splitsFor(const Problem &p) const {
  return combine ? abi::split::launchSplits(spec, p, config, smCount) : 0;
}

void ForwardKernel::classifyBlocks(
    const Problem &p, int64_t batch, int64_t heads, CUdeviceptr counts,
    CUdeviceptr indices,
    const std::array<CUdeviceptr, abi::kMaxCaptures> &captures, CUstream stream,
    CUdeviceptr cuSeqQ, CUdeviceptr cuSeqKV) const {
  p.validate(spec);
  MaskBlocksLaunch launch = maskBlocksLaunch(spec, p, batch, heads);
  if (!blocks)
    throw SpecError("mask blocks: this kernel image holds no classification "
                    "(compiled by an older flashjit?)");
  if (!counts || !indices)
    throw SpecError("mask blocks: the layout's counts and indices are null");
  for (int c = 0; c < int(spec.captures); ++c)
    if (!captures[size_t(c)])
      throw SpecError(
          fmt::format("mask blocks: captured tensor {} is null", c));
  checkSeqOffsetPointers(spec, cuSeqQ, cuSeqKV);
  CUdeviceptr bufs[abi::NumBuffers] = {};
  bufs[abi::Counts] = counts;
  bufs[abi::Indices] = indices;
  bufs[abi::CuSeqQ] = cuSeqQ;
  bufs[abi::CuSeqKV] = cuSeqKV;
  float unusedScale = 0;
  std::array<CUdeviceptr, abi::kMaxCaptures> captured = captures;
  void *params[abi::NumBuffers + abi::NumIndexArgs + 1 + abi::kMaxCaptures];
  size_t n = 0;
  for (CUdeviceptr &ptr : bufs)
    params[n++] = &ptr;
  for (int64_t &i : launch.index)
    params[n++] = &i;
  params[n++] = &unusedScale;
  for (int c = 0; c < int(spec.captures); ++c)
    params[n++] = &captured[size_t(c)];
  // Both record rows 1: grid.x is the launch's program count.
  auto grid = [&](int64_t programs) {
    Problem g;
    g.batch = batch;
    g.heads = heads;
    g.seqLenQ = programs;
    return g;
  };
  launchRecorded(blocks, blocksOf, grid(launch.classPrograms), 1, stream,
                 params);
  launchRecorded(blockLists, blockListsOf, grid(launch.listPrograms), 1, stream,
                 params);
}

std::shared_ptr<DeviceBuffer>
ForwardKernel::workspace(std::size_t bytes) const {
  std::lock_guard<std::mutex> lock(workspaceMutex);
  if (!shared || shared->size() < bytes)
    shared = std::make_shared<DeviceBuffer>(
        std::max<std::size_t>(bytes, std::size_t(1) << 20));
  return shared;
}

PreparedForward::PreparedForward(const ForwardKernel &kernel, const Problem &p,
                                 const ForwardArgs &a, CUstream stream)
    : function(kernel.cuFunction()), copy(kernel.copyBytes()),
      sparse(kernel.attentionSpec().blockSparse) {
  const AttentionSpec &spec = kernel.attentionSpec();
  p.validate(spec);
  checkDeviceTensors({&a.q, &a.k, &a.v, &a.o}, copy, chooseCopyBytes(a));
  if (sparse && (!a.counts || !a.indices))
    throw SpecError("a block-sparse kernel needs a layout");
  checkSeqOffsetPointers(spec, a.cuSeqQ, a.cuSeqKV);
  varlen = spec.varlen;
  captureCount = int(spec.captures);
  for (int c = 0; c < captureCount; ++c)
    if (!a.captures[c])
      throw SpecError(fmt::format("the score modifier captures {} tensors; "
                                  "captured tensor {} is null",
                                  captureCount, c));

  abi::TensorStrides strides;
  strides.q = a.q.strides;
  strides.k = a.k.strides;
  strides.v = a.v.strides;
  strides.o = a.o.strides;
  strides.counts = a.countStrides;
  strides.indices = a.indexStrides;
  auto forwardIndex = abi::indexArgs(spec, p, strides);
  std::copy(forwardIndex.begin(), forwardIndex.end(), index.begin());
  scaleLog2 = float(p.effectiveScale(spec) / std::log(2.0));

  const KernelLaunch &launch = kernel.recorded();
  splitCount = kernel.splitsFor(p);
  std::array<int64_t, 3> grid = kernel.launchGrid(p, splitCount);
  if (grid[1] > 65535)
    throw SpecError(
        fmt::format("batch * heads = {} exceeds the grid's 65535", grid[1]));
  gridDim = Dim3{unsigned(grid[0]), unsigned(grid[1]), unsigned(grid[2])};
  scheduled = launch.scheduled;
  if (scheduled)
    schedule = kernel.tileSchedule(p, grid[0], stream);
  if (splitCount) {
    // o_part (f32 [S, B, H, Nq, dv]) then lse_part (f32 [S, B, H, Nq]).
    index[abi::split::KvSplits] = splitCount;
    const std::size_t rows =
        std::size_t(splitCount * p.batch * p.heads * p.seqLenQ);
    const std::size_t oBytes = rows * std::size_t(spec.headDimV) * 4;
    workspace = kernel.workspace(oBytes + rows * 4);
    oPart = workspace->ptr();
    lsePart = oPart + oBytes;
    combine = kernel.combineFunction();
    const KernelLaunch &c = kernel.combineLaunch();
    std::array<int64_t, 3> cg = c.grid(p, spec.gqaGroup);
    combineGrid = Dim3{unsigned(cg[0]), unsigned(cg[1]), unsigned(cg[2])};
    combineBlock = Dim3{unsigned(c.threads), 1, 1};
  }
  tensorMaps = launch.tensorMaps;
  if (tensorMaps.size() > kMaxTensorMaps)
    throw RuntimeError(ErrorCode::InvalidArgument,
                       fmt::format("the kernel takes {} tensor maps, the "
                                   "launcher at most {}",
                                   tensorMaps.size(), kMaxTensorMaps));
  bf16 = spec.dtype == DType::BF16;
  blockDim = Dim3{unsigned(launch.threads), 1, 1};
  shared = unsigned(launch.sharedBytes);
  if (!function || !gridDim.x || !gridDim.z || !blockDim.x)
    throw RuntimeError(ErrorCode::InvalidArgument,
                       "PreparedForward: an empty launch");
  allowSharedBytes(function, shared);
  // FLASHJIT_PACKED_LAUNCH=1: launch() packs its arguments, in the order
  // packForwardArguments lays out.
  const char *env = std::getenv("FLASHJIT_PACKED_LAUNCH");
  if (env && std::string(env) == "1") {
    packing = packForwardArguments(splitCount > 0, captureCount,
                                   int(tensorMaps.size()), scheduled);
    if (packing.bytes > kMaxPackedBytes)
      packing = {};
  }
}

PackedParams
packParams(std::initializer_list<std::tuple<int, unsigned, unsigned>> runs) {
  PackedParams p;
  for (auto [count, size, align] : runs)
    for (int i = 0; i < count; ++i) {
      p.bytes = (p.bytes + align - 1) / align * align;
      p.offsets.push_back(unsigned(p.bytes));
      p.sizes.push_back(size);
      p.bytes += size;
    }
  return p;
}

PackedParams packForwardArguments(bool split, int captures, int tensorMaps,
                                  bool scheduled) {
  return packParams(
      {{abi::NumBuffers + (split ? 2 : 0), 8, 8},
       {split ? abi::split::NumIndexArgs : abi::NumIndexArgs, 8, 8},
       {1, 4, 4},
       {captures, 8, 8},
       {scheduled ? 1 : 0, 8, 8},
       {tensorMaps, unsigned(sizeof(TensorMap)), 64}});
}

void PreparedForward::launch(const ForwardBuffers &b, CUstream stream) const {
  CUdeviceptr bufs[abi::NumBuffers] = {b.q,   b.k,      b.v,      b.o,
                                       b.lse, b.counts, b.indices};
  // Dense kernels never read the layout; give them a valid pointer anyway.
  if (!sparse)
    bufs[abi::Counts] = bufs[abi::Indices] = b.q;
  bufs[abi::CuSeqQ] = varlen ? b.cuSeqQ : b.q;
  bufs[abi::CuSeqKV] = varlen ? b.cuSeqKV : b.q;
  void *params[abi::split::NumBuffers + abi::split::NumIndexArgs + 1 +
               abi::kMaxCaptures + 1 + kMaxTensorMaps];
  TensorMap maps[kMaxTensorMaps];
  std::array<CUdeviceptr, abi::kMaxCaptures> captured = b.captures;
  int n = 0;
  for (CUdeviceptr &ptr : bufs)
    params[n++] = &ptr;
  if (splitCount) {
    params[n++] = &oPart;
    params[n++] = &lsePart;
  }
  const int indexCount =
      splitCount ? abi::split::NumIndexArgs : abi::NumIndexArgs;
  for (int i = 0; i < indexCount; ++i)
    params[n++] = &index[i];
  params[n++] = &scaleLog2;
  for (int c = 0; c < captureCount; ++c)
    params[n++] = &captured[c];
  CUdeviceptr tiles = schedule ? schedule->ptr() : 0;
  if (scheduled) // the tile schedule, before the tensor maps
    params[n++] = &tiles;
  if (!tensorMaps.empty()) {
    // cuLaunchKernel copies the parameters: the cache may change after.
    std::lock_guard<std::mutex> lock(mapsMutex);
    bool same = mapsEncoded;
    for (size_t i = 0; i < tensorMaps.size(); ++i)
      same &= encodedBases[i] == bufs[tensorMaps[i].buffer];
    if (!same) {
      mapsEncoded = false; // until every map is encoded
      for (size_t i = 0; i < tensorMaps.size(); ++i) {
        encodedBases[i] = bufs[tensorMaps[i].buffer];
        encodeMap(encodedMaps[i], tensorMaps[i], encodedBases[i]);
      }
      mapsEncoded = true;
    }
    for (size_t i = 0; i < tensorMaps.size(); ++i) {
      maps[i] = encodedMaps[i];
      params[n++] = &maps[i];
    }
  }
  if (!packing.bytes) {
    launchKernel(function, gridDim, blockDim, shared, stream, params);
    if (splitCount) // the merge of the partials, in stream order
      launchKernel(combine, combineGrid, combineBlock, 0, stream, params);
    return;
  }
  alignas(64) unsigned char packed[kMaxPackedBytes];
  for (int i = 0; i < n; ++i)
    std::memcpy(packed + packing.offsets[i], params[i], packing.sizes[i]);
  std::size_t bytes = packing.bytes;
  // cuda.h's CU_LAUNCH_PARAM_BUFFER_POINTER, _BUFFER_SIZE and _END.
  void *extra[] = {reinterpret_cast<void *>(1), packed,
                   reinterpret_cast<void *>(2), &bytes, nullptr};
  CudaDriver &driver = CudaDriver::get();
  launchKernel(function, gridDim, blockDim, shared, stream, nullptr, driver,
               extra);
  if (splitCount)
    launchKernel(combine, combineGrid, combineBlock, 0, stream, nullptr, driver,
                 extra);
}

TensorMapShape recordedMapShape(const TensorMapRecord &m, const int64_t *index,
                                int64_t batchHeads) {
  // 16-bit elements: cols, rows, then the outer dimensions.
  TensorMapShape s;
  s.rank = 2 + int(m.outer.size());
  s.dims[0] = uint64_t(m.cols);
  s.dims[1] = uint64_t(index[m.rows]);
  s.strideBytes[0] = uint64_t(index[m.rowStride]) * 2;
  s.box = {uint32_t(m.boxCols), uint32_t(m.boxRows), 1, 1, 1};
  for (size_t i = 0; i < m.outer.size(); ++i) {
    s.dims[2 + i] = uint64_t(batchHeads);
    s.strideBytes[1 + i] = uint64_t(index[m.outer[i]]) * 2;
  }
  return s;
}

void encodeRecordedMap(TensorMap &out, const TensorMapRecord &m,
                       CUdeviceptr base, const int64_t *index,
                       int64_t batchHeads, bool bf16) {
  TensorMapShape s = recordedMapShape(m, index, batchHeads);
  encodeTensorMap(out, base, s.rank, s.dims.data(), s.strideBytes.data(),
                  s.box.data(), bf16);
}

void PreparedForward::encodeMap(TensorMap &out, const TensorMapRecord &m,
                                CUdeviceptr base) const {
  encodeRecordedMap(out, m, base, index.data(),
                    index[abi::Batch] * index[abi::Heads], bf16);
}

void ForwardKernel::launch(const Problem &p, const ForwardArgs &a,
                           CUstream stream) const {
  PreparedForward prepared(*this, p, a, stream);
  CudaDriver::get().ensureContext();
  ForwardBuffers b{a.q.ptr,     a.k.ptr,  a.v.ptr,   a.o.ptr,
                   a.lse,       a.counts, a.indices, a.captures,
                   a.cuSeqQ,    a.cuSeqKV};
  // As ever: a null buffer (a dense kernel's layout) points at q.
  for (CUdeviceptr *ptr : {&b.lse, &b.counts, &b.indices})
    if (!*ptr)
      *ptr = b.q;
  prepared.launch(b, stream);
}

} // namespace flashjit::rt
