//===- AttentionLauncher.h - Launch a compiled forward kernel ---*- C++ -*-===//
//
/// \file
/// Launches a cubin made by flashjit's GPU pipeline: fills the argument list
/// of kernels/KernelABI.h from device pointers and strides, and takes the
/// grid, block and shared memory from the resources the lowering recorded
/// on each kernel (kernels/KernelLaunch.h). No MLIR here: the compile step
/// is the caller's.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_RUNTIME_ATTENTIONLAUNCHER_H
#define FLASHJIT_RUNTIME_ATTENTIONLAUNCHER_H

#include "kernels/AttentionSpec.h"
#include "kernels/GpuGeometry.h"
#include "kernels/KernelABI.h"
#include "kernels/KernelLaunch.h"
#include "runtime/CudaDriver.h"

#include <array>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

namespace flashjit::rt {

/// The recorded launch of kernel \p name in \p image; throws RuntimeError
/// (InvalidArgument) when the image does not record it.
const KernelLaunch &recordedLaunch(const KernelImage &image,
                                   const std::string &name);

/// Launches \p function as \p launch says for \p p (grid over \p gqa
/// query heads per KV head); throws SpecError when batch * heads exceeds
/// the grid's y limit.
void launchRecorded(CUfunction function, const KernelLaunch &launch,
                    const Problem &p, int64_t gqa, CUstream stream,
                    void **params);

/// The most tensor maps a kernel takes, which both launchers make room
/// for: the forward's K and V, and Q and O; the backward's Q and dO.
inline constexpr size_t kMaxTensorMaps = 4;

/// The shape a recorded tensor map (KernelLaunch.h) takes for one launch,
/// innermost dimension first: cols, then the rows (index argument
/// `rows`), then each outer dimension, \p batchHeads long (a bound of any
/// index the kernel computes from its program ids); the byte strides of
/// every dimension but the first, and the box.
struct TensorMapShape {
  int rank = 0;
  std::array<uint64_t, 5> dims{};
  std::array<uint64_t, 4> strideBytes{};
  std::array<uint32_t, 5> box{};
};
/// \p index holds the launch's index arguments in \p m's ABI.
TensorMapShape recordedMapShape(const TensorMapRecord &m, const int64_t *index,
                                int64_t batchHeads);

/// Encodes recorded tensor map \p m over \p base in the shape
/// recordedMapShape gives. Throws RuntimeError when the driver refuses it.
void encodeRecordedMap(TensorMap &out, const TensorMapRecord &m,
                       CUdeviceptr base, const int64_t *index,
                       int64_t batchHeads, bool bf16);

/// A (B, H, N, d) tensor on the device: pointer and element strides.
struct DeviceTensor {
  CUdeviceptr ptr = 0;
  std::array<int64_t, 4> strides{};
};

/// The device-side arguments of one forward call.
struct ForwardArgs {
  DeviceTensor q, k, v, o;
  CUdeviceptr lse = 0; ///< fp32 [B, H, Nq], packed
  CUdeviceptr counts = 0, indices = 0;
  std::array<int64_t, 3> countStrides{}, indexStrides{};
  /// The score modifier's captured tensors (f32, AttentionSpec::captures of
  /// them, in the region's order); their sizes are the caller's promise.
  std::array<CUdeviceptr, abi::kMaxCaptures> captures{};
  /// Varlen kernels only (AttentionSpec::varlen): i32 [B + 1] offsets of
  /// the sequences in q (and o) and in k, v (kernels/KernelABI.h); their
  /// contents are the caller's promise (checkSeqOffsets on the host).
  CUdeviceptr cuSeqQ = 0, cuSeqKV = 0;
};

/// The widest global->shared copy (16, 8, 4 or 2 bytes) that the pointers
/// and strides of Q, K, V and O allow (the forward stores O 16 bytes at a
/// time where it copies 16). Part of the compiled variant.
int64_t chooseCopyBytes(const ForwardArgs &args);

/// Throws SpecError unless every tensor's innermost stride is 1 and the
/// tensors allow (\p allowedCopy) the copy width the kernel was compiled
/// for (\p compiledCopy).
void checkDeviceTensors(std::initializer_list<const DeviceTensor *> tensors,
                        int64_t compiledCopy, int64_t allowedCopy);

/// Throws SpecError unless a varlen kernel (AttentionSpec::varlen) gets
/// both offset arrays and any other kernel neither.
void checkSeqOffsetPointers(const AttentionSpec &spec, CUdeviceptr cuSeqQ,
                            CUdeviceptr cuSeqKV);

class ForwardKernel;

/// A kernel's arguments packed into one buffer, as cuLaunchKernel also
/// takes them (`extra`: CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE): in order,
/// each at the next multiple of its alignment, as the PTX lays out .param
/// space (8 for a pointer or an int64, 4 for an f32, 64 for a 128-byte
/// tensor map).
struct PackedParams {
  std::vector<unsigned> offsets, sizes; ///< one of each per argument
  std::size_t bytes = 0;                ///< the buffer's size
};

/// The packing of runs of arguments: (count, size, alignment) each.
PackedParams
packParams(std::initializer_list<std::tuple<int, unsigned, unsigned>> runs);
/// The packing of a forward kernel's arguments as PreparedForward passes
/// them: the buffers (and a split's two), the index arguments (and a
/// split's count), scale * log2(e), \p captures pointers, \p tensorMaps
/// maps.
PackedParams packForwardArguments(bool split, int captures, int tensorMaps,
                                  bool scheduled = false);

/// The buffers of one forward call: what changes from call to call of a
/// PreparedForward.
struct ForwardBuffers {
  CUdeviceptr q = 0, k = 0, v = 0, o = 0, lse = 0;
  CUdeviceptr counts = 0, indices = 0; ///< block-sparse only
  /// The captured tensors (ForwardArgs::captures).
  std::array<CUdeviceptr, abi::kMaxCaptures> captures{};
  CUdeviceptr cuSeqQ = 0, cuSeqKV = 0; ///< varlen only (ForwardArgs)
};

/// A forward launch of one kernel for one problem, strides and layout
/// shape, prepared once: the checks, the grid, the index arguments, scale
/// * log2(e) and the function's shared memory attribute. launch() only
/// fills in the buffers and calls cuLaunchKernel: no allocation, no
/// string, no lookup, no synchronization (capturable into a CUDA graph).
/// Read-only after construction, so threads may share one. A split-KV
/// kernel (kernels/KernelABI.h abi::split) launches its partial on a
/// grid.z of splits() and then its combine, through the kernel's workspace
/// (ForwardKernel::workspace, taken here): launches of one kernel that
/// overlap in time (other streams) must not use split kernels.
class PreparedForward {
public:
  /// Checks \p p and \p shape (its strides, layout strides and copy width;
  /// its pointers only for the copy width) as ForwardKernel::launch does,
  /// and raises the function's shared memory limit; a scheduled kernel
  /// takes its tile schedule for \p p (ForwardKernel::tileSchedule, not
  /// made while \p stream is being captured). Throws SpecError or
  /// RuntimeError. \p kernel must outlive this object.
  PreparedForward(const ForwardKernel &kernel, const Problem &p,
                  const ForwardArgs &shape, CUstream stream = nullptr);

  /// Launches on \p stream in the current context (the kernel's). The
  /// caller checks the buffers (non-null, aligned to copyBytes()).
  void launch(const ForwardBuffers &buffers, CUstream stream) const;

  /// The copy width the kernel was compiled for: q, k and v must be
  /// aligned to it.
  int64_t copyBytes() const { return copy; }
  bool blockSparse() const { return sparse; }
  /// The split count of a split-KV kernel's launches; 0 for one pass.
  int64_t splits() const { return splitCount; }
  Dim3 grid() const { return gridDim; }
  Dim3 block() const { return blockDim; }
  unsigned sharedBytes() const { return shared; }

private:
  /// The largest packed argument buffer (PackedParams): every argument,
  /// four tensor maps and their alignment fit.
  static constexpr std::size_t kMaxPackedBytes = 2048;
  /// Encodes \p m over \p base for this launch's index arguments.
  void encodeMap(TensorMap &out, const TensorMapRecord &m,
                 CUdeviceptr base) const;

  CUfunction function = nullptr;
  Dim3 gridDim, blockDim;
  unsigned shared = 0;
  int64_t copy = 0;
  bool sparse = false;
  bool varlen = false; ///< AttentionSpec::varlen
  int captureCount = 0; ///< AttentionSpec::captures
  /// Mutable only because cuLaunchKernel takes void **; never written
  /// after construction. The split ABI's kv_splits is the last.
  mutable std::array<int64_t, abi::split::NumIndexArgs> index{};
  mutable float scaleLog2 = 0;
  /// The arguments packed into one buffer (FLASHJIT_PACKED_LAUNCH=1, to
  /// compare the driver's two ways of taking them; empty: the array of
  /// pointers).
  PackedParams packing;
  /// Split-KV: the combine and its grid, the workspaces (o_part, lse_part).
  int64_t splitCount = 0;
  CUfunction combine = nullptr;
  Dim3 combineGrid, combineBlock;
  std::shared_ptr<DeviceBuffer> workspace;
  mutable CUdeviceptr oPart = 0, lsePart = 0;
  /// A scheduled kernel (KernelLaunch::scheduled): its tile schedule (null:
  /// the kernel's fixed stride), passed before the tensor maps.
  bool scheduled = false;
  std::shared_ptr<DeviceBuffer> schedule;
  /// The kernel's tensor maps (KernelLaunch::tensorMaps), encoded over a
  /// launch's buffers, and whether its elements are bf16. The last
  /// encoding is kept with the bases it was made for: a launch over the
  /// same buffers (a plan called again) copies it instead of encoding.
  std::vector<TensorMapRecord> tensorMaps;
  bool bf16 = true;
  mutable std::mutex mapsMutex;
  mutable std::array<TensorMap, kMaxTensorMaps> encodedMaps;
  mutable std::array<CUdeviceptr, kMaxTensorMaps> encodedBases{};
  mutable bool mapsEncoded = false;
};

/// A loaded forward kernel.
class ForwardKernel {
public:
  /// Loads \p image; throws RuntimeError (also when it does not record
  /// the forward kernel's launch). A split-KV image (it records
  /// "attention_combine") launches \p config's splits, or (0, auto) as
  /// many as chooseKvSplits gives for the device's SMs and \p config's Bc.
  ForwardKernel(const KernelImage &image, const AttentionSpec &spec,
                int64_t copyBytes, const TileConfig &config = {});

  /// Launches on \p stream (nullptr: the legacy default stream). Throws
  /// SpecError for bad arguments, RuntimeError for driver errors.
  void launch(const Problem &problem, const ForwardArgs &args,
              CUstream stream) const;

  /// The recorded launch of the kernel.
  const KernelLaunch &recorded() const { return launchOf; }
  int64_t copyBytes() const { return copy; }
  CUfunction cuFunction() const { return function; }
  const AttentionSpec &attentionSpec() const { return spec; }
  /// Split-KV: the combine function and its launch (null when one pass).
  CUfunction combineFunction() const { return combine; }
  const KernelLaunch &combineLaunch() const { return combineOf; }
  /// The split count for \p p: abi::split::launchSplits on the device's
  /// SMs (0 for a one-pass kernel).
  int64_t splitsFor(const Problem &p) const;
  /// The mask_mod's block classification (kernels/KernelABI.h abi::blocks;
  /// the image of a block-sparse spec with a mask_mod holds it): writes the
  /// \p batch x \p heads layout of \p p (checkMaskBlocksArgs) into the
  /// packed device arrays \p counts [batch, heads, q blocks] and \p indices
  /// [batch, heads, q blocks, kv blocks] (entries past a count: classes),
  /// the mask reading \p captures; varlen: a row per sequence, whose
  /// lengths the device offsets \p cuSeqQ, \p cuSeqKV give (batch + 1
  /// each, as the forward's). Queued on \p stream; throws SpecError.
  void
  classifyBlocks(const Problem &p, int64_t batch, int64_t heads,
                 CUdeviceptr counts, CUdeviceptr indices,
                 const std::array<CUdeviceptr, abi::kMaxCaptures> &captures,
                 CUstream stream, CUdeviceptr cuSeqQ = 0,
                 CUdeviceptr cuSeqKV = 0) const;
  /// The main kernel's grid for \p p with \p splits split-KV partials
  /// (splitsFor(p); 0 without): a persistent kernel
  /// (KernelLaunch::persistent) has one program per SM along grid.x (its
  /// ring takes the SM).
  std::array<int64_t, 3> launchGrid(const Problem &p, int64_t splits) const {
    return launchOf.grid(p, spec.gqaGroup, std::max<int64_t>(splits, 1),
                         launchOf.persistent ? smCount : 0);
  }
  /// A device workspace of at least \p bytes, shared by this kernel's
  /// prepared launches (a larger one replaces it; holders keep theirs).
  std::shared_ptr<DeviceBuffer> workspace(std::size_t bytes) const;
  /// A scheduled kernel's tile schedule for \p p on \p programs programs
  /// (kernels/TileSchedule.h: the causal cost of each Q block, heads in
  /// groups whose K and V fill at most half the L2), made and uploaded
  /// once per shape and kept (FLASHJIT_TILE_SCHEDULE=0: none). Null, for
  /// the kernel's fixed stride, where it takes none, with that variable
  /// 0, past 2^22 tiles, or
  /// while \p stream is being captured into a CUDA graph and the schedule
  /// is not made yet (nothing is allocated during a capture).
  std::shared_ptr<DeviceBuffer> tileSchedule(const Problem &p, int64_t programs,
                                             CUstream stream) const;

private:
  Module module;
  CUfunction function = nullptr, combine = nullptr, blocks = nullptr,
             blockLists = nullptr;
  AttentionSpec spec;
  KernelLaunch launchOf, combineOf, blocksOf, blockListsOf;
  int64_t copy;
  TileConfig config;
  int smCount = 0;
  int l2Bytes = 0;
  mutable std::mutex workspaceMutex;
  mutable std::shared_ptr<DeviceBuffer> shared;
  /// tileSchedule's, by (batch * heads, seq_q, seq_kv, programs).
  mutable std::mutex scheduleMutex;
  mutable std::map<std::array<int64_t, 4>, std::shared_ptr<DeviceBuffer>>
      schedules;
};

} // namespace flashjit::rt

#endif // FLASHJIT_RUNTIME_ATTENTIONLAUNCHER_H
