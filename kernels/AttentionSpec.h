//===- AttentionSpec.h - What the user asks flashjit to compile -*- C++ -*-===//
//
/// \file
/// The compile-time description of an attention kernel (AttentionSpec), the
/// tiling choice it is compiled with (TileConfig) and the run-time problem it
/// is launched on (Problem). Plain C++: no MLIR or LLVM headers, so the
/// runtime, the CLI and the tests can include it cheaply.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_KERNELS_ATTENTIONSPEC_H
#define FLASHJIT_KERNELS_ATTENTIONSPEC_H

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashjit {

/// Input/output element type of Q, K, V and O (lse is always fp32).
enum class DType { BF16, FP16 };

/// Which keys a query may see. Window sizes are run-time arguments.
enum class MaskKind { None, Causal, SlidingWindow };

/// Forward (O, lse) or backward (dQ, dK, dV from the forward's O and lse).
enum class Direction { Forward, Backward };

/// A usage or validation error: the CLI prints it on one line and exits 2.
class SpecError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// "Infinite" window extent: larger than any sequence length we accept.
constexpr int64_t kUnboundedWindow = int64_t(1) << 40;

/// The most elements one tensor of a problem (q, k, v, o, their gradients,
/// lse) may hold: 2^40, i.e. 2 TiB of 16-bit elements, past any host's or
/// GPU's memory, so a real problem never meets it while every index and byte
/// count of an accepted one stays far from int64 overflow. Checked as a
/// total (checkProblemSize), not per dimension.
constexpr int64_t kMaxTensorElements = int64_t(1) << 40;
/// The farthest element a strided (B, H, N, d) view may reach from its base
/// pointer: 2^47 elements (2^48 bytes, 256 TiB), past any address space a
/// host or a GPU has (checkTensorReach).
constexpr int64_t kMaxTensorReach = int64_t(1) << 47;
/// The softmax scale's bounds (0 aside, which means 1/sqrt(head_dim)). The
/// kernels compute exp2(scale * log2(e) * s - m) in f32: below 2^-126 the
/// f32 scale is denormal (flushed to zero on the GPU: every score 0); above
/// 2^63, scale * log2(e) exceeds 2^64 and a score |s| >= 2^64 (|q| |k| of
/// 2^32 at d = 1) overflows f32 to inf, and inf - inf is NaN. Within the
/// bounds every score |s| < 2^64 stays finite.
constexpr double kMinScale = 0x1p-126;
constexpr double kMaxScale = 0x1p63;

/// The compile-time description. One compiled kernel serves every batch,
/// head count, sequence length, scale and window size.
struct AttentionSpec {
  int64_t headDimQK = 128;
  int64_t headDimV = 128;
  DType dtype = DType::BF16;
  MaskKind mask = MaskKind::None;
  /// Query heads per KV head (1 = multi-head attention).
  int64_t gqaGroup = 1;
  /// Run-time block-sparse layout (BCSR over sparse blocks) when true.
  bool blockSparse = false;
  /// Rows and columns of one block of the sparse layout.
  int64_t sparseBlock = 128;
  Direction direction = Direction::Forward;
  /// Backward only (the forward ignores it): dQ by a separate pass over Q
  /// blocks, bit-identical run to run, instead of atomic adds into an f32
  /// workspace from the dK/dV loop (faster: two fewer matmuls).
  bool deterministic = false;
  /// A named score modifier (the description's score_mod region), "" for
  /// none: "softcap:C" or "alibi:H" (ScoreMod), applied to the scaled score
  /// before the mask and the softmax; "custom" for a region that is no
  /// named variant, read from a description (then scoreFunction is set).
  std::string scoreMod;
  /// A "custom" modifier's region, as MLIR prints it ("{\n  ^bb0(%arg0:
  /// f32, ...): ... attn.yield %y : f32\n  }": canonical, so that two
  /// spellings of one region are one kernel); "" otherwise. Part of the
  /// spec's JSON, hence of every cache key. withScoreModRegion
  /// (compiler/Compiler.h) sets it with scoreFunction.
  std::string scoreModRegion;
  /// The float64 evaluation of a "custom" score_mod region (its value and
  /// derivative), for the reference; null otherwise.
  std::shared_ptr<const class ScoreFunction> scoreFunction;
  /// How many tensors the modifier regions capture (their arguments after
  /// kv_idx, memref<?xf32>): the score_mod region's, then the mask_mod
  /// region's; the kernel's buffers after its ABI's
  /// (AttentionData::captures on the CPU). Set with the regions.
  int64_t captures = 0;
  /// A mask modifier (the description's mask_mod region: (batch, head,
  /// q_idx, kv_idx, captured tensors) -> i1, false makes the score -inf
  /// after the score modifier), as MLIR prints it canonically; "" for
  /// none. Part of the name and the JSON (`mask_mod_region`), hence of
  /// every cache key. withModifierRegions (compiler/Compiler.h) sets it
  /// with maskFunction and maskCaptures.
  std::string maskModRegion;
  /// The float64 evaluation of the mask_mod region (value 1 keeps, 0
  /// masks; the score argument is ignored), for the reference.
  std::shared_ptr<const class ScoreFunction> maskFunction;
  /// How many of `captures` are the mask_mod region's (the last ones).
  int64_t maskCaptures = 0;
  /// Backward only: the captured tensors whose gradient the backward adds
  /// into their gradient buffers (bit c: capture c; the rest are constants
  /// there). Part of the backward's name and JSON (`capture_grads`).
  int64_t captureGrads = 0;
  /// Variable-length packing: Q, K, V, O (and the backward's dO, dQ, dK,
  /// dV) hold the sequences of a batch one after another, (total_tokens,
  /// heads, d); run-time i32 offsets cu_seqlens_q / cu_seqlens_kv ([B + 1],
  /// 0 first, non-decreasing) say where sequence b starts and ends. Problem
  /// then gives B and the longest sequences (seqLenQ, seqLenKV: the grid's
  /// extent and the padded rows of lse and the workspaces). Masks, windows
  /// and score modifiers see each sequence's own positions and lengths
  /// (causal: bottom-right aligned per sequence). Not with blockSparse.
  /// Part of the name (`_varlen`) and the JSON (`"varlen":true`).
  bool varlen = false;

  /// Throws SpecError naming the bad field and value.
  void validate() const;
  /// Stable one-line text form, e.g. "fwd_bf16_dqk96_dv96_causal_g1".
  std::string name() const;
  /// JSON object text (no trailing newline).
  std::string toJson() const;
};

/// The tiling choice (pipeline options, never global flags).
struct TileConfig {
  int64_t blockM = 64; ///< Br: query rows per program.
  int64_t blockN = 64; ///< Bc: key rows per KV-loop iteration.
  int64_t warps = 4;
  int64_t stages = 2;
  /// Split-KV (FlashDecoding, kernels/KernelABI.h abi::split): 0 the
  /// one-pass forward; else the split partial and its combine, launched
  /// with this many splits (kAutoSplits: chosen at launch from the SM
  /// count and the problem, chooseKvSplits). Forward only.
  int64_t splits = 0;
  /// The software-pipelined KV loop (flashjit-tile-attention's
  /// overlap-softmax): S = Q K^T of block t + 1 is issued before the
  /// softmax of block t. Forward only.
  bool overlapSoftmax = false;
  /// The K/V ring's forward as a persistent kernel: a grid of the device's
  /// SMs loops over the tiles, so that one tile's epilogue runs beside the
  /// next one's loads (the `persistent` pass option). Forward only; where
  /// the kernel has no K/V ring or splits the keys it is one tile per
  /// program regardless (FLASHJIT_PERSISTENT=0/1 overrides it).
  bool persistent = false;
  /// With the K/V ring's tensor maps, the producer loads Q by its tensor
  /// map too (the `tma=2` pass option): with `persistent`, the next tile's
  /// Q while this tile's last products run. Forward only; ignored where
  /// the K/V ring takes no tensor maps (FLASHJIT_TMA=0/kv/qkv overrides
  /// it).
  bool queryByTensorMap = false;
  /// O stored by its tensor map too, with Q's (the `tma=3` pass option):
  /// where O stages through a slot of its own, each warp's lane 0 stores
  /// its rows from there by the TMA (TileToGPUTma.cpp); elsewhere as
  /// without. Forward only; FLASHJIT_TMA overrides it like
  /// queryByTensorMap.
  bool outputByTensorMap = false;
  static constexpr int64_t kAutoSplits = -1;
  static constexpr int64_t kMaxSplits = 256;

  /// Throws SpecError if the config cannot serve \p spec.
  void validate(const AttentionSpec &spec) const;
  std::string toJson() const;
};

/// The run-time problem: sizes and run-time kernel arguments.
struct Problem {
  int64_t batch = 1;
  int64_t heads = 1; ///< Query heads; KV heads = heads / gqaGroup.
  int64_t seqLenQ = 128;
  int64_t seqLenKV = 128;
  /// Softmax scale; 0 means 1/sqrt(headDimQK).
  double scale = 0.0;
  /// Sliding window: query i sees key j iff
  /// i + (Nkv - Nq) - left <= j <= i + (Nkv - Nq) + right.
  int64_t windowLeft = kUnboundedWindow;
  int64_t windowRight = kUnboundedWindow;

  /// Throws SpecError for sizes that cannot serve \p spec.
  void validate(const AttentionSpec &spec) const;
  double effectiveScale(const AttentionSpec &spec) const;
  int64_t kvHeads(const AttentionSpec &spec) const {
    return heads / spec.gqaGroup;
  }
  std::string toJson(const AttentionSpec &spec) const;
};

/// Throws SpecError if a tensor of \p problem under \p spec (q, k, v, o, or
/// lse) would hold more than kMaxTensorElements elements, naming the tensor,
/// its factors and their product (or that the product overflows int64). The
/// CLI and the C API (so the Python binding) call it before they allocate.
void checkProblemSize(const AttentionSpec &spec, const Problem &problem);

/// Throws SpecError naming \p what if the strided view of \p shape (4 sizes
/// >= 1) and \p strides (4 strides >= 0, in elements) reaches past element
/// kMaxTensorReach of its base: sum (shape[i] - 1) * strides[i] is computed
/// without overflow.
void checkTensorReach(const char *what, const int64_t *shape,
                      const int64_t *strides);

/// The effective (left, right) band of \p spec on \p problem: causal is
/// (inf, 0), none is (inf, inf), sliding window is the problem's window.
std::pair<int64_t, int64_t> effectiveWindow(const AttentionSpec &spec,
                                            const Problem &problem);

/// The attn-dialect module that describes \p spec (the first stage of the
/// pipeline), declaring the kernel \p name.
std::string attnModuleText(const AttentionSpec &spec, const std::string &name);

/// The captured tensors of a score_mod region, in its argument order: flat
/// f32 buffers that the region indexes itself (AttentionSpec::captures).
using Captures = std::vector<std::vector<float>>;

/// A score_mod region that is no named variant, as the reference evaluates
/// it: the modified score of \p score (the scaled q.k) of query \p qIdx
/// and key \p kvIdx in \p batch and query head \p head, in float64, and
/// its derivative with respect to \p score in \p dScore; the region's
/// captured tensors (its arguments after kv_idx) are \p captures (null
/// when it has none).
class ScoreFunction {
public:
  virtual ~ScoreFunction() = default;
  virtual double apply(double score, int64_t batch, int64_t head, int64_t qIdx,
                       int64_t kvIdx, const Captures *captures,
                       double *dScore) const = 0;
  /// One load of a captured tensor at a score: which tensor, the element
  /// read, and d(modified score) / d(that element).
  struct CaptureRead {
    int capture = 0;
    int64_t index = 0;
    double derivative = 0;
  };
  /// The loads apply() makes at this score, each with its derivative (for
  /// the captured tensors' gradients); none by default.
  virtual std::vector<CaptureRead>
  captureReads(double score, int64_t batch, int64_t head, int64_t qIdx,
               int64_t kvIdx, const Captures *captures) const {
    (void)score, (void)batch, (void)head, (void)qIdx, (void)kvIdx,
        (void)captures;
    return {};
  }
};

/// The spelling of a score_mod region that is no named variant.
inline constexpr const char *kCustomScoreMod = "custom";

/// A named score modifier (AttentionSpec::scoreMod), parsed. With s the
/// scaled score scale * q.k of query i and key j (absolute 0-based
/// positions in Q and K) in query head h:
///
///   softcap:C  C * tanh(s / C); C > 0, finite as an f32.
///   alibi:H    s + slope_h * (j - i), slope_h = 2^(-8 (h + 1) / H): the
///              ALiBi slopes of H heads (H the problem's query heads, an
///              integer in [1, 2^20]). j - i is FlexAttention's relative
///              position; where Nq != Nkv it differs from the bottom-right
///              aligned j - i - (Nkv - Nq) by a constant per head, which
///              leaves O unchanged and makes lse larger by
///              slope_h * (Nkv - Nq).
struct ScoreMod {
  enum class Kind { None, Softcap, Alibi, Custom };
  /// Every named kind.
  static constexpr Kind kNamedKinds[] = {Kind::Softcap, Kind::Alibi};
  Kind kind = Kind::None;
  /// softcap's C, rounded to f32 as the kernel's constant is.
  double cap = 0;
  /// alibi's H.
  int64_t heads = 0;
  /// Custom: the region's evaluation, and the captured tensors it reads
  /// (set by whoever evaluates it on data: the references).
  std::shared_ptr<const ScoreFunction> custom;
  const Captures *captures = nullptr;
  /// This modifier reading \p data as its captured tensors.
  ScoreMod reading(const Captures *data) const {
    ScoreMod m = *this;
    m.captures = data;
    return m;
  }

  /// \p text parsed ("" is Kind::None); throws SpecError naming the text
  /// for an unknown name or a bad argument.
  static ScoreMod parse(const std::string &text);
  /// \p spec's modifier: its region's evaluation for "custom" (a SpecError
  /// without one), else parse(spec.scoreMod); with a mask_mod region, a
  /// custom modifier that is -inf (derivative 0, no capture reads) where
  /// the mask yields false and that modifier elsewhere.
  static ScoreMod of(const AttentionSpec &spec);
  /// The modifier of \p kind (not None) with \p argument (softcap's C,
  /// alibi's H); throws SpecError when it is no argument of that kind.
  static ScoreMod of(Kind kind, double argument);
  /// The canonical text: parse(name()) is this modifier, and every text
  /// parsed to it has this name ("softcap:20.0" is "softcap:20"); "" for
  /// none.
  std::string name() const;
  /// \p score of query \p qIdx and key \p kvIdx in query head \p head
  /// (and \p batch), modified, in float64: the reference's side of the
  /// modifier.
  double apply(double score, int64_t head, int64_t qIdx, int64_t kvIdx,
               int64_t batch = 0) const;
  /// The captured tensors' loads apply() makes there, with their
  /// derivatives (a custom region's; none for the named variants).
  std::vector<ScoreFunction::CaptureRead>
  captureReads(double score, int64_t head, int64_t qIdx, int64_t kvIdx,
               int64_t batch) const {
    return custom ? custom->captureReads(score, batch, head, qIdx, kvIdx,
                                         captures)
                  : std::vector<ScoreFunction::CaptureRead>();
  }
  /// d apply / d score there, in float64 (derived by hand for the named
  /// variants, by dual numbers for a custom region: the reference of the
  /// compiler's derivative).
  double derivative(double score, int64_t head = 0, int64_t qIdx = 0,
                    int64_t kvIdx = 0, int64_t batch = 0) const;
};

/// How the backward accumulates dQ. SeparatePass (spec.deterministic): a
/// second pass over Q blocks recomputes P and dS and sums dQ in registers:
/// deterministic by construction, no dQ workspace. Atomic (the default): the
/// dK/dV loop adds dS K into an f32 dq_accum workspace (zeroed by the
/// preprocess step), and a last step scales and converts it to dQ.
enum class DqAccumulation { SeparatePass, Atomic };

/// The dQ accumulation \p spec asks for.
inline DqAccumulation dqAccumulation(const AttentionSpec &spec) {
  return spec.deterministic ? DqAccumulation::SeparatePass
                            : DqAccumulation::Atomic;
}

/// The workspace the backward of \p spec on \p problem needs, in bytes: the
/// per-row statistics (f32 [2, B, H, Nq]: delta = rowsum(dO * O), then
/// -lse * log2(e)) and, for Atomic (dqAccumulation(spec)), dq_accum (f32
/// [B, H, Nq, dqk]) after them. A block-sparse backward also needs room for the
/// layout's KV-major transpose: the C API's flashjit_backward_workspace_size
/// counts both.
int64_t backwardWorkspaceBytes(const AttentionSpec &spec,
                               const Problem &problem);

const char *toString(DType dtype);
const char *toString(MaskKind mask);
/// "atomic" or "separate_pass" (the run JSON's dq_mode).
const char *toString(DqAccumulation mode);
/// Bytes of one element of \p dtype.
inline int64_t elementBytes(DType) { return 2; }

} // namespace flashjit

#endif // FLASHJIT_KERNELS_ATTENTIONSPEC_H
