/*===- flashjit.h - flashjit's C API ----------------------------*- C -*-===//
 *
 * The C interface of libflashjit.so: describe an attention (a spec), run its
 * forward and backward passes on device pointers (CUDA) or host pointers (the
 * CPU execution mode), read the tiling flashjit chose, and print any stage of
 * the pipeline (PTX included). Pure C99; no C++ type crosses this boundary and
 *no C++ exception leaves it: every function returns a flashjit_status and
 *leaves a message for flashjit_last_error().
 *
 *   flashjit_handle *h;
 *   if (flashjit_create(&h, FLASHJIT_DEVICE_CUDA) != FLASHJIT_OK)
 *     fprintf(stderr, "%s\n", flashjit_last_error(NULL));
 *   flashjit_spec spec;
 *   flashjit_spec_init(&spec);          // bf16, d = 128, no mask, gqa 1
 *   spec.head_dim_qk = spec.head_dim_v = 96;
 *   spec.mask = FLASHJIT_MASK_CAUSAL;
 *   flashjit_tensor q = {q_ptr, {B, H, N, 96}, {H * N * 96, N * 96, 96, 1}};
 *   ...                                  // k, v, o likewise
 *   flashjit_forward(h, &spec, &q, &k, &v, &o, lse_ptr, 0.0, -1, -1, NULL,
 *                    stream);
 *   flashjit_destroy(h);
 *
 * A forward run many times on one shape can be prepared once
 * (flashjit_plan_create) and then run on new pointers with one cheap call
 * (flashjit_plan_forward): see "Prepared forward calls" below.
 *
 * CUDA: flashjit never creates a context. It uses the calling thread's
 * current context (e.g. the one PyTorch made current); if there is none, it
 * retains the primary context of the handle's device (flashjit_set_cuda_device,
 * default 0) and makes it current -- the context the CUDA runtime uses too.
 * Kernels are launched on the stream given; forward never synchronizes, so it
 * can be captured into a CUDA graph once its kernel is compiled (the first
 * call for a spec compiles and loads a module, which a capture may refuse).
 * The backward does not synchronize either, except for a block-sparse spec
 * called without the layout's transpose (it reads the layout on the host;
 * see flashjit_backward and flashjit_backward_kv_major).
 *
 * Threads: a handle may be shared by threads; compiled kernels are cached in
 * it per (spec, tiling, copy width, arch, CUDA context).
 *
 *===----------------------------------------------------------------------===*/
#ifndef FLASHJIT_CAPI_FLASHJIT_H
#define FLASHJIT_CAPI_FLASHJIT_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define FLASHJIT_API
#else
#define FLASHJIT_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** Bumped when a struct or a signature of this header changes. */
#define FLASHJIT_C_API_VERSION 13

/** An opaque handle: a device and its cache of compiled kernels. */
typedef struct flashjit_handle flashjit_handle;

/** An opaque prepared forward call (flashjit_plan_create). Since version
 *  4. */
typedef struct flashjit_plan flashjit_plan;

/* ---------------------------------------------------------------------- */
/* Status and errors                                                       */
/* ---------------------------------------------------------------------- */

typedef enum flashjit_status {
  FLASHJIT_OK = 0,
  /** A bad argument: the message names the field and the value. */
  FLASHJIT_ERROR_INVALID_ARGUMENT = 1,
  /** No CUDA driver (libcuda.so.1) or no GPU on this machine. */
  FLASHJIT_ERROR_NO_DRIVER = 2,
  /** The pipeline, LLVM's NVPTX backend or nvJitLink failed. */
  FLASHJIT_ERROR_COMPILE = 3,
  /** A CUDA driver call failed (the message names the call). */
  FLASHJIT_ERROR_CUDA = 4,
  /** Not implemented (nothing returns it today; kept for ABI stability). */
  FLASHJIT_ERROR_NOT_IMPLEMENTED = 5,
  /** A bug or an out-of-memory on the host. */
  FLASHJIT_ERROR_INTERNAL = 6
} flashjit_status;

/** "OK", "INVALID_ARGUMENT", ... (a static string). */
FLASHJIT_API const char *flashjit_status_name(flashjit_status status);

/** The message of the last call that failed on the calling thread (any
 *  handle; \p handle may be NULL and is only accepted for symmetry), "" if
 *  none failed. Valid until the thread's next failing flashjit call. */
FLASHJIT_API const char *flashjit_last_error(const flashjit_handle *handle);

/** The library's version, e.g. "0.1.0". */
FLASHJIT_API const char *flashjit_version(void);

/* ---------------------------------------------------------------------- */
/* Handles                                                                 */
/* ---------------------------------------------------------------------- */

typedef enum flashjit_device {
  /** Host pointers, the CPU execution mode (MLIR's JIT, host threads). */
  FLASHJIT_DEVICE_CPU = 0,
  /** Device pointers in the current CUDA context, launched on a stream. */
  FLASHJIT_DEVICE_CUDA = 1
} flashjit_device;

/** Creates a handle for \p device (a flashjit_device). For CUDA it loads the
 *  driver and fails with FLASHJIT_ERROR_NO_DRIVER if there is none; it does
 *  not touch any context. */
FLASHJIT_API flashjit_status flashjit_create(flashjit_handle **handle,
                                             int device);
/** Frees the handle and its compiled kernels (NULL is fine). On CUDA, the
 *  contexts its modules were loaded in should still be alive; it waits for
 *  the backward's last use of the library's workspace before freeing it. */
FLASHJIT_API void flashjit_destroy(flashjit_handle *handle);

/** The device ordinal whose primary context is used when the calling thread
 *  has no current context (default 0). CUDA handles only. */
FLASHJIT_API flashjit_status flashjit_set_cuda_device(flashjit_handle *handle,
                                                      int ordinal);

/** Number of compiled kernels cached in the handle. */
FLASHJIT_API int64_t flashjit_cached_kernels(const flashjit_handle *handle);

/* ---------------------------------------------------------------------- */
/* The description                                                         */
/* ---------------------------------------------------------------------- */

typedef enum flashjit_dtype {
  FLASHJIT_DTYPE_BF16 = 0,
  FLASHJIT_DTYPE_FP16 = 1
} flashjit_dtype;

/** Which pass a spec describes to flashjit_chosen_config and flashjit_emit.
 *  flashjit_forward and flashjit_backward run their own pass whatever it
 *  says. */
typedef enum flashjit_direction {
  FLASHJIT_DIRECTION_FORWARD = 0,
  FLASHJIT_DIRECTION_BACKWARD = 1
} flashjit_direction;

typedef enum flashjit_mask {
  FLASHJIT_MASK_NONE = 0,
  /** Bottom-right aligned causal: window (inf, 0). */
  FLASHJIT_MASK_CAUSAL = 1,
  /** Query i sees key j iff i + (Nkv - Nq) - left <= j <= i + (Nkv - Nq)
   *  + right; left and right are run-time arguments of flashjit_forward. */
  FLASHJIT_MASK_SLIDING_WINDOW = 2
} flashjit_mask;

/** What a kernel is compiled for. One compiled kernel serves every batch,
 *  head count, sequence length, scale, window size and layout. */
typedef struct flashjit_spec {
  int64_t head_dim_qk;  /**< 1..512 */
  int64_t head_dim_v;   /**< 1..512 */
  int32_t dtype;        /**< flashjit_dtype of Q, K, V and O */
  int32_t mask;         /**< flashjit_mask */
  int64_t gqa;          /**< query heads per KV head, >= 1 */
  int32_t block_sparse; /**< nonzero: a flashjit_layout is given at run time */
  int32_t direction;    /**< flashjit_direction (0, forward) */
  int64_t sparse_block; /**< rows and columns of one layout block (128) */
  /** Backward only (the forward ignores it): 1, dQ by a separate pass over
   *  Q blocks, bit-identical run to run; 0 (default), dQ by atomic adds into
   *  an fp32 workspace from the dK/dV loop (faster, a larger workspace; the
   *  last bits of dQ may vary run to run). Since version 3. With captured
   *  gradients (flashjit_backward_captured), 1 also sums those in fixed
   *  point, the same bits run to run (since version 11). */
  int32_t deterministic;
  /** Nonzero: variable-length packing, the batch's sequences one after
   *  another in the tensors (run by flashjit_forward_varlen and
   *  flashjit_backward_varlen, which see flashjit_varlen); 0 (default):
   *  (B, H, N, d) tensors. With block_sparse (since version 9): the
   *  layout in flashjit_varlen, per sequence. Since version 8 (the
   *  field was `reserved`, which had to be 0). */
  int32_t varlen;
  /** A score modifier on score = scale * q.k, forward and backward; NULL
   *  or "" for none (flashjit_spec_init sets NULL). Either a named one, at
   *  most 255 characters: "softcap:C" (C * tanh(score / C), C > 0) or
   *  "alibi:H" (score + 2^(-8 (h + 1) / H) (kv_idx - q_idx), H the
   *  problem's query heads); or (since version 6) the text of a score_mod
   *  region, at most 65536 characters, starting with "{": "{ ^bb0(%s: f32,
   *  %b: index, %h: index, %i: index, %j: index): ... attn.yield %y : f32
   *  }" with arith and math ops on scalars (flashjit_emit's "attn" stage
   *  prints one); its derivative for the backward is derived by the
   *  compiler. Read during the call only (a plan keeps a copy). Since
   *  version 5. */
  const char *score_mod;
  /** A mask modifier, forward and backward; NULL or "" for none
   *  (flashjit_spec_init sets NULL): the text of a mask_mod region, at
   *  most 65536 characters, "{ ^bb0(%b: index, %h: index, %i: index, %j:
   *  index): ... attn.yield %keep : i1 }" with arith and math ops on
   *  scalars and memref.load of captured tensors (arguments after %j,
   *  memref<?xf32>). Where it yields false the score is -inf after the
   *  score modifier (a row that keeps no key gives 0 and lse -inf). Its
   *  captured tensors follow score_mod's in the calls' `captured` arrays
   *  and take no gradient. Read during the call only. Since version 9. */
  const char *mask_mod;
} flashjit_spec;

/** Defaults: head dims 128, bf16, no mask, gqa 1, dense, sparse block 128,
 *  atomic dQ (deterministic 0), no score modifier. */
FLASHJIT_API void flashjit_spec_init(flashjit_spec *spec);

/** A (B, H, N, d) tensor: 16-bit elements (the spec's dtype), strides in
 *  elements, the innermost stride 1, the others >= 0 and arbitrary, as long
 *  as the farthest element, sum (shape[i] - 1) * strides[i], is below 2^47.
 *
 *  Limits of every call that takes tensors (FLASHJIT_ERROR_INVALID_ARGUMENT
 *  past them, before anything is copied or allocated): each of q, k, v, o
 *  and lse holds at most 2^40 elements (the products B * H * N * d checked
 *  without overflow; so is a layout's batch * heads * q_blocks * kv_blocks);
 *  the scale is 0 or in [2^-126, 2^63] (see flashjit_forward). */
typedef struct flashjit_tensor {
  void *data;
  int64_t shape[4];
  int64_t strides[4];
} flashjit_tensor;

/** A block-sparse layout in BCSR form, as FlexAttention's BlockMask:
 *  counts[b][h][qb] KV blocks are listed for sparse Q block qb, at
 *  indices[b][h][qb][0 .. count). Both arrays are packed int32; a batch or
 *  heads of 1 broadcasts. q_blocks = ceil(Nq / sparse_block), kv_blocks =
 *  ceil(Nkv / sparse_block). Device pointers on CUDA (the forward does not
 *  check them: a count or index out of range is undefined behaviour; the
 *  backward reads and checks them on the host), host pointers on the CPU
 *  (checked). An entry k >= 0 lists KV block k; ~k (= -k - 1) lists it as
 *  full: the spec's mask_mod keeps every element of that block pair, so the
 *  kernel does not evaluate the mask there (FlexAttention's full blocks;
 *  a block marked full where the mask is not all true is computed
 *  unmasked). Without a mask_mod both mean the same. */
typedef struct flashjit_layout {
  const int32_t *counts;
  const int32_t *indices;
  int64_t batch, heads, q_blocks, kv_blocks;
} flashjit_layout;

/* ---------------------------------------------------------------------- */
/* Running                                                                 */
/* ---------------------------------------------------------------------- */

/** O = softmax(scale * Q K^T + mask) V, and lse = logsumexp of each row
 *  (natural log; -inf for a row that sees no key, whose O is 0).
 *
 *  q: (B, H, Nq, head_dim_qk)     k: (B, H / gqa, Nkv, head_dim_qk)
 *  v: (B, H / gqa, Nkv, head_dim_v)   o: (B, H, Nq, head_dim_v), written
 *  lse: fp32 [B, H, Nq] packed, written; required on CUDA, may be NULL on
 *       the CPU.
 *  scale: 0 means 1 / sqrt(head_dim_qk); else in [2^-126, 2^63]: the
 *       kernels work in f32 with scale * log2(e), which must be a normal
 *       f32 and keep scale * log2(e) * score finite for |score| < 2^64.
 *  window_left, window_right: FLASHJIT_MASK_SLIDING_WINDOW only (>= 0, -1 =
 *       unbounded); pass -1, -1 for the other masks.
 *  layout: required iff spec->block_sparse, else NULL.
 *  cuda_stream: a CUstream (NULL: the legacy default stream); ignored on
 *       the CPU, where the call returns when O is written. */
FLASHJIT_API flashjit_status
flashjit_forward(flashjit_handle *handle, const flashjit_spec *spec,
                 const flashjit_tensor *q, const flashjit_tensor *k,
                 const flashjit_tensor *v, const flashjit_tensor *o, float *lse,
                 double scale, int64_t window_left, int64_t window_right,
                 const flashjit_layout *layout, void *cuda_stream);

/** A tensor that a score_mod region captures (since version 7): \p size
 *  float32 elements at \p data, device memory on CUDA and host memory on
 *  the CPU, read during the call only. The region reads it with memref.load
 *  at the index it computes (its arguments after kv_idx are memref<?xf32>,
 *  one per captured tensor), e.g. a bias bias[(h * Nq + i) * Nkv + j] or
 *  segment ids. The kernels evaluate the region only at positions inside
 *  the problem (padding rows and columns of a tile take the last ones'), so
 *  an index that is in range for every (b, h, i, j) of the problem stays in
 *  range; one that is not reads out of bounds on CUDA (the CPU's float64
 *  check names it). */
typedef struct flashjit_captured {
  const float *data;
  int64_t size;
  /** flashjit_backward_captured only (the forward ignores it): where
   *  d loss / d data is ADDED (float32, size elements, the caller zeroes
   *  it first), or NULL for a tensor that needs no gradient. */
  float *grad;
} flashjit_captured;

/** flashjit_forward for a score_mod region that captures tensors: its
 *  \p num_captured captured tensors (spec->score_mod's count, in its
 *  argument order) in \p captured. flashjit_forward refuses such a spec
 *  (INVALID_ARGUMENT: it gives none); this call with 0 and NULL is
 *  flashjit_forward. The backward: flashjit_backward_captured. Since
 *  version 7. */
FLASHJIT_API flashjit_status flashjit_forward_captured(
    flashjit_handle *handle, const flashjit_spec *spec,
    const flashjit_tensor *q, const flashjit_tensor *k,
    const flashjit_tensor *v, const flashjit_tensor *o, float *lse,
    double scale, int64_t window_left, int64_t window_right,
    const flashjit_layout *layout, const flashjit_captured *captured,
    int64_t num_captured, void *cuda_stream);

/** The block-sparse layout of spec->mask_mod (since version 10): the
 *  library's classification kernel, built with the forward of \p spec
 *  (block_sparse, a mask_mod region, not varlen: see
 *  flashjit_mask_blocks_varlen), evaluates the mask on
 *  every sparse_block x sparse_block block pair of a problem of \p batch x
 *  \p heads query heads, \p seq_q x \p seq_kv positions, never
 *  materialising an N x N mask, on the handle's device (CUDA: queued on
 *  \p cuda_stream; the CPU: done when the call returns), and WRITES
 *  layout->counts and layout->indices (device memory on CUDA, host memory
 *  on the CPU; packed [layout->batch, layout->heads, q_blocks, kv_blocks]):
 *  for each row the KV blocks with an element the mask keeps, ascending,
 *  ~k (= -k - 1) for a block it keeps whole (full: the forward and the
 *  backward skip the mask there); the entries past a row's count are
 *  unspecified (no kernel reads them). layout->batch, layout->heads: \p batch,
 * \p heads or 1 (for a mask that does not depend on them, evaluated at 0);
 *  layout->q_blocks, kv_blocks: ceil(seq / sparse_block). \p captured:
 *  the regions' captured tensors, as flashjit_forward_captured's. The
 *  layout then serves flashjit_forward* and flashjit_backward* of the same
 *  spec and problem. */
FLASHJIT_API flashjit_status flashjit_mask_blocks(
    flashjit_handle *handle, const flashjit_spec *spec, int64_t batch,
    int64_t heads, int64_t seq_q, int64_t seq_kv, const flashjit_layout *layout,
    const flashjit_captured *captured, int64_t num_captured, void *cuda_stream);

/** The sequences of a variable-length batch (spec->varlen; since version
 *  8). Its tensors hold the sequences one after another: q and o a
 *  (total_q, H, d) tensor given as shape {1, H, total_q, d} with strides
 *  {any, its head stride, its token stride, 1}; k, v and their gradients
 *  likewise over total_kv. Sequence b is rows [cu_seqlens_q[b],
 *  cu_seqlens_q[b + 1]) of q and o and rows [cu_seqlens_kv[b],
 *  cu_seqlens_kv[b + 1]) of k and v; masks, windows and score modifiers
 *  see positions within the sequence (causal is bottom-right aligned per
 *  sequence), a sequence without keys gives O = 0 and lse = -inf. lse is
 *  fp32 [batch, H, max_seqlen_q] packed (the rows past a sequence's length
 *  are not written); the backward's workspace is
 *  flashjit_backward_workspace_size's for (batch, H, max_seqlen_q,
 *  max_seqlen_kv). */
typedef struct flashjit_varlen {
  /** [batch + 1] int32 offsets, 0 first, non-decreasing, the last at most
   *  the tensors' rows: device memory on CUDA (not read on the host there:
   *  offsets out of range are undefined behaviour), host memory on the CPU
   *  (checked: INVALID_ARGUMENT naming the bad one). */
  const int32_t *cu_seqlens_q;
  const int32_t *cu_seqlens_kv; /**< [batch + 1], likewise */
  int64_t batch;                /**< the number of sequences, >= 1 */
  /** At least the longest query (key) sequence and at least 1: the grid
   *  spans it and lse is padded to it. */
  int64_t max_seqlen_q, max_seqlen_kv;
  /** A block-sparse layout for a spec with block_sparse (since version 9;
   *  NULL without): [batch, H (or 1), ceil(max_seqlen_q / sparse_block),
   *  ceil(max_seqlen_kv / sparse_block)], each sequence's blocks counted
   *  from its own start (blocks listed past a sequence's keys are masked
   *  there). Zero-initialise the struct: older callers' NULL. */
  const flashjit_layout *layout;
  /** The layout's KV-major transpose for flashjit_backward_varlen (since
   *  version 13; NULL: made on the host, as flashjit_backward does, with
   *  its synchronizations), as flashjit_backward_kv_major's kv_layout; the
   *  forward ignores it. */
  const flashjit_layout *kv_layout;
} flashjit_varlen;

/** flashjit_mask_blocks for a varlen spec (since version 11): the layout
 *  of \p varlen (varlen->layout, required, [varlen->batch, \p heads or 1,
 *  ceil(max_seqlen_q / sparse_block), ceil(max_seqlen_kv / sparse_block)])
 *  WRITTEN for its sequences, each classified on its own lengths and
 *  positions (as the forward sees them), a Q block past a sequence's end
 *  with count 0. The offsets are device memory on CUDA (not read on the
 *  host), host memory on the CPU (checked). */
FLASHJIT_API flashjit_status flashjit_mask_blocks_varlen(
    flashjit_handle *handle, const flashjit_spec *spec, int64_t heads,
    const flashjit_varlen *varlen, const flashjit_captured *captured,
    int64_t num_captured, void *cuda_stream);

/** flashjit_forward_captured for a varlen spec (spec->varlen nonzero):
 *  the sequences in \p varlen (required; its layout for a block-sparse
 *  spec). flashjit_forward and
 *  flashjit_forward_captured refuse a varlen spec, this call a spec
 *  without. Since version 8. */
FLASHJIT_API flashjit_status flashjit_forward_varlen(
    flashjit_handle *handle, const flashjit_spec *spec,
    const flashjit_tensor *q, const flashjit_tensor *k,
    const flashjit_tensor *v, const flashjit_tensor *o, float *lse,
    double scale, int64_t window_left, int64_t window_right,
    const flashjit_varlen *varlen, const flashjit_captured *captured,
    int64_t num_captured, void *cuda_stream);

/** The backward pass: dq, dk, dv from q, k, v, o, d_o and the forward's lse
 *  (dk and dv shaped as k and v, summed over each GQA group), by
 *  recomputation (FlashAttention-2 order). dQ by spec->deterministic: 0, the
 *  dK/dV loop adds dS K into an fp32 accumulator in the workspace with
 *  atomic adds and a last step converts it (the order of the adds varies,
 *  so dQ's last bits may too); 1, a separate pass over Q blocks, no
 *  atomics: bit-identical run to run. dK and dV are bit-identical either
 *  way.
 *
 *  q, k, v, o, scale, window_left, window_right, layout: as given to the
 *       flashjit_forward that made o and lse.
 *  d_o: shaped as o; dq, dk, dv: shaped as q, k, v, written (any outer
 *       strides, innermost stride 1, as every tensor here).
 *  lse: the forward's, fp32 [B, H, Nq] packed: finite, or -inf for a row
 *       that sees no key. A CPU handle refuses a NaN or +inf entry
 *       (FLASHJIT_ERROR_INVALID_ARGUMENT, naming it); CUDA does not read
 *       lse on the host, so there it is the caller's to keep.
 *  workspace, workspace_bytes: scratch memory of at least the bytes
 *       flashjit_backward_workspace_size gives for this spec and shape,
 *       16-byte aligned, that nothing else touches until the call's kernels
 *       have run (device memory on CUDA; memory that is stream-ordered on
 *       \p cuda_stream, as cuMemAllocAsync's or torch's caching
 *       allocator's, is fine). NULL and 0: the library's own buffer (below).
 *       A CPU handle does not touch it but checks the size all the same.
 *  cuda_stream: a CUstream (NULL: the legacy default stream); ignored on
 *       the CPU, where the call returns when dq, dk and dv are written.
 *
 *  CUDA: three kernels (delta = rowsum(d_o * o) into the workspace, then dK
 *  and dV, then dQ: the conversion of the accumulator, or the separate
 *  pass) are launched on \p cuda_stream in that order. The tiling
 *  is the one tuned for the backward on this GPU and problem class if the
 *  disk cache holds one, else the default backward tiling: the backward
 *  never tunes on a first call. Kernels are cached in the handle as the
 *  forward's are.
 *
 *  The library's workspace (workspace NULL): one device buffer per handle
 *  and CUDA context, grown as needed and freed by flashjit_destroy. Each
 *  call makes its stream wait, on the device, for the previous call's use
 *  of the buffer (a CUDA event), so calls on different streams are
 *  serialized on the device, never racing; growing the buffer waits on the
 *  host for its last use before freeing it. Refused while \p cuda_stream is
 *  being captured into a CUDA graph: pass a workspace then.
 *
 *  Block-sparse on CUDA: the dK/dV kernel walks the layout KV-major, so the
 *  call copies counts and indices to the host in stream order and
 *  synchronizes \p cuda_stream, checks them (a count or index out of range,
 *  or a KV block listed twice in a row, is FLASHJIT_ERROR_INVALID_ARGUMENT,
 *  as on the CPU), writes their transpose into the workspace and
 *  synchronizes again before it launches: not capturable into a CUDA
 *  graph. flashjit_backward_kv_major takes the transpose from the caller
 *  instead, and neither copies nor synchronizes. */
FLASHJIT_API flashjit_status flashjit_backward(
    flashjit_handle *handle, const flashjit_spec *spec,
    const flashjit_tensor *q, const flashjit_tensor *k,
    const flashjit_tensor *v, const flashjit_tensor *o,
    const flashjit_tensor *d_o, const float *lse, const flashjit_tensor *dq,
    const flashjit_tensor *dk, const flashjit_tensor *dv, double scale,
    int64_t window_left, int64_t window_right, const flashjit_layout *layout,
    void *workspace, size_t workspace_bytes, void *cuda_stream);

/** flashjit_backward for a score_mod region that captures tensors: the
 *  same \p captured tensors as the forward's (flashjit_backward refuses
 *  such a spec). The region is evaluated on the captured data to recompute
 *  P and its derivative with respect to the score; where a captured
 *  tensor's grad is not NULL, d loss / d data (derived by the compiler from
 *  the region) is added into it, by atomic adds. With spec->deterministic
 *  (since version 11) the contributions are summed in 64-bit fixed point
 *  instead (two words, 2^-56 apart from 2^38: exact integer adds, so the
 *  gradient is the same bits run to run; a larger gradient saturates, a
 *  NaN or infinite contribution makes the whole gradient NaN),
 *  whose words the workspace holds: size it with
 *  flashjit_backward_captured_workspace_size (flashjit_backward_workspace_
 *  size's bytes are then too few, INVALID_ARGUMENT); a tensor with a grad
 *  has 1 .. 2^31 - 1 elements. Since version 7. */
FLASHJIT_API flashjit_status flashjit_backward_captured(
    flashjit_handle *handle, const flashjit_spec *spec,
    const flashjit_tensor *q, const flashjit_tensor *k,
    const flashjit_tensor *v, const flashjit_tensor *o,
    const flashjit_tensor *d_o, const float *lse, const flashjit_tensor *dq,
    const flashjit_tensor *dk, const flashjit_tensor *dv, double scale,
    int64_t window_left, int64_t window_right, const flashjit_layout *layout,
    void *workspace, size_t workspace_bytes, const flashjit_captured *captured,
    int64_t num_captured, void *cuda_stream);

/** flashjit_backward_captured with the layout's KV-major transpose given
 *  by the caller (since version 13): \p kv_layout lists, for each (b, h,
 *  KV block kb), kv_layout->counts[b][h][kb] Q blocks at
 *  kv_layout->indices[b][h][kb][0 .. count), in increasing order, an entry
 *  ~qb where \p layout marks the pair full; its batch and heads are
 *  layout's, its q_blocks layout's kv_blocks and its kv_blocks layout's
 *  q_blocks (a flashjit_layout whose rows are KV blocks). Both are needed
 *  (the dQ pass walks \p layout, the dK/dV kernel \p kv_layout).
 *
 *  On CUDA, where both are device memory, the call reads neither on the
 *  host: no copy and no synchronization, so it can be captured into a
 *  CUDA graph (with a caller's workspace); as with the forward's layout, a
 *  count or index out of range, or a kv_layout that is not layout's
 *  transpose, is undefined behaviour. A CPU handle checks layout as
 *  flashjit_backward does and kv_layout against its transpose
 *  (FLASHJIT_ERROR_INVALID_ARGUMENT naming the first difference). */
FLASHJIT_API flashjit_status flashjit_backward_kv_major(
    flashjit_handle *handle, const flashjit_spec *spec,
    const flashjit_tensor *q, const flashjit_tensor *k,
    const flashjit_tensor *v, const flashjit_tensor *o,
    const flashjit_tensor *d_o, const float *lse, const flashjit_tensor *dq,
    const flashjit_tensor *dk, const flashjit_tensor *dv, double scale,
    int64_t window_left, int64_t window_right, const flashjit_layout *layout,
    const flashjit_layout *kv_layout, void *workspace, size_t workspace_bytes,
    const flashjit_captured *captured, int64_t num_captured, void *cuda_stream);

/** flashjit_backward_captured for a varlen spec: the forward's \p varlen
 *  (required); dq, dk, dv packed as q, k, v; no layout. The other backward
 *  calls refuse a varlen spec. Since version 8. */
FLASHJIT_API flashjit_status flashjit_backward_varlen(
    flashjit_handle *handle, const flashjit_spec *spec,
    const flashjit_tensor *q, const flashjit_tensor *k,
    const flashjit_tensor *v, const flashjit_tensor *o,
    const flashjit_tensor *d_o, const float *lse, const flashjit_tensor *dq,
    const flashjit_tensor *dk, const flashjit_tensor *dv, double scale,
    int64_t window_left, int64_t window_right, const flashjit_varlen *varlen,
    void *workspace, size_t workspace_bytes, const flashjit_captured *captured,
    int64_t num_captured, void *cuda_stream);

/** The workspace flashjit_backward needs for \p spec on a problem (batch,
 *  query heads, query and key sequence lengths), in *bytes: fp32
 *  [2, B, H, Nq] (per-row statistics: delta = rowsum(dO * O) and
 *  -lse * log2(e)), then, unless spec->deterministic, the dQ accumulator
 *  (fp32 [B, H, Nq, head_dim_qk], from the next 16-byte boundary: 8 more
 *  bytes where B * H * Nq is odd), and, for a block-sparse spec, room for
 *  the layout's KV-major transpose at that batch and heads (a broadcast
 *  layout uses less). The same for CPU and CUDA handles; no GPU is
 *  touched. */
FLASHJIT_API flashjit_status flashjit_backward_workspace_size(
    flashjit_handle *handle, const flashjit_spec *spec, int64_t batch,
    int64_t heads, int64_t seq_len_q, int64_t seq_len_kv, size_t *bytes);

/** flashjit_backward_workspace_size for flashjit_backward_captured (and
 *  _varlen) with \p captured (the call's, \p num_captured of them: the
 *  spec's count): with spec->deterministic and a non-NULL grad, the bytes
 *  also hold each such tensor's fixed-point words (16 bytes per element,
 *  rounded up); otherwise flashjit_backward_workspace_size's. Since
 *  version 11. */
FLASHJIT_API flashjit_status flashjit_backward_captured_workspace_size(
    flashjit_handle *handle, const flashjit_spec *spec, int64_t batch,
    int64_t heads, int64_t seq_len_q, int64_t seq_len_kv,
    const flashjit_captured *captured, int64_t num_captured, size_t *bytes);

/* ---------------------------------------------------------------------- */
/* Prepared forward calls (since version 4)                                */
/* ---------------------------------------------------------------------- */

/// Prepares the forward call flashjit_forward(handle, spec, q, k, v, o, lse,
/// scale, window_left, window_right, layout, cuda_stream) would make, once:
/// the spec and the tensors' shapes and strides are checked (the same named
/// errors), the tiling is chosen, the kernel compiled or taken from the
/// handle's or the disk cache and loaded, and on CUDA the launch is laid out
/// (grid, block, shared memory, every scalar argument). On success *plan
/// is a plan for any number of flashjit_plan_forward calls of that shape;
/// on failure *plan is NULL.
///
/// What the plan keeps: the spec, q's, k's, v's and o's shapes and strides,
/// scale, window_left, window_right, the layout's dimensions (batch, heads,
/// q_blocks, kv_blocks), and on CUDA the current context and the copy width
/// that q's, k's and v's data pointers and strides allow (16 bytes for
/// 16-byte aligned pointers and strides that are multiples of 8). The data
/// pointers given here are used for that width and, like flashjit_forward's
/// first call of a (spec, problem class, GPU), for tuning: creating a plan
/// may run the candidate kernels on them, writing o and lse (never q, k, v
/// or the layout). It launches nothing else: run the call itself with
/// flashjit_plan_forward. A stream being captured into a CUDA graph gets
/// the heuristic tiling (no tuning, no synchronization).
///
/// A plan holds its kernel: it stays valid after flashjit_destroy(handle),
/// and on CUDA it should be destroyed while its context is alive.
FLASHJIT_API flashjit_status flashjit_plan_create(
    flashjit_handle *handle, const flashjit_spec *spec,
    const flashjit_tensor *q, const flashjit_tensor *k,
    const flashjit_tensor *v, const flashjit_tensor *o, float *lse,
    double scale, int64_t window_left, int64_t window_right,
    const flashjit_layout *layout, void *cuda_stream, flashjit_plan **plan);

/// Runs a plan's forward on new data: q, k, v, o and lse are data pointers
/// of tensors shaped and strided as the plan's (o and lse written, as by
/// flashjit_forward); block_counts and block_indices, a block-sparse plan's
/// layout arrays (of its dimensions), NULL for a dense plan; cuda_stream a
/// CUstream (NULL: the legacy default stream), ignored on the CPU.
///
/// Checked per call: no pointer is NULL (lse may be NULL on the CPU), q, k
/// and v are aligned to the plan's copy width (else
/// FLASHJIT_ERROR_INVALID_ARGUMENT: make a plan for such pointers), the
/// layout pointers are given iff the plan is block-sparse (the CPU checks
/// their contents as flashjit_forward does; CUDA does not read them on the
/// host). Shapes and strides are the caller's promise: the call does not
/// see them.
///
/// CUDA: the launch runs in the plan's context (pushed for the call and
/// popped after when another is current) on cuda_stream: one
/// cuCtxGetCurrent and one cuLaunchKernel, no allocation, no
/// synchronization, no lock; capturable into a CUDA graph. A plan may be
/// used by several threads at once.
FLASHJIT_API flashjit_status flashjit_plan_forward(
    const flashjit_plan *plan, const void *q, const void *k, const void *v,
    void *o, float *lse, const int32_t *block_counts,
    const int32_t *block_indices, void *cuda_stream);

/// flashjit_plan_create for a spec whose score_mod / mask_mod regions
/// capture tensors (since version 12): \p captured and \p num_captured as
/// flashjit_forward_captured takes them (grads ignored). The plan keeps
/// each captured tensor's size; its calls give their pointers by
/// flashjit_plan_forward_captured (tuning, where the plan tunes, reads the
/// tensors given here). flashjit_plan_create refuses such a spec
/// (INVALID_ARGUMENT naming this call); this call with 0 and NULL is
/// flashjit_plan_create.
FLASHJIT_API flashjit_status flashjit_plan_create_captured(
    flashjit_handle *handle, const flashjit_spec *spec,
    const flashjit_tensor *q, const flashjit_tensor *k,
    const flashjit_tensor *v, const flashjit_tensor *o, float *lse,
    double scale, int64_t window_left, int64_t window_right,
    const flashjit_layout *layout, const flashjit_captured *captured,
    int64_t num_captured, void *cuda_stream, flashjit_plan **plan);

/// flashjit_plan_forward with the captured tensors of a plan made by
/// flashjit_plan_create_captured (since version 12): \p num_captured must
/// be the plan's count, each captured[c].data non-NULL (device memory on
/// CUDA, host memory on the CPU; float32) and captured[c].size the size
/// the plan was made with (else FLASHJIT_ERROR_INVALID_ARGUMENT); grads are
/// ignored. The launch is flashjit_plan_forward's: no allocation, no
/// synchronization, no lock. flashjit_plan_forward refuses a plan whose
/// spec captures tensors.
FLASHJIT_API flashjit_status flashjit_plan_forward_captured(
    const flashjit_plan *plan, const void *q, const void *k, const void *v,
    void *o, float *lse, const int32_t *block_counts,
    const int32_t *block_indices, const flashjit_captured *captured,
    int64_t num_captured, void *cuda_stream);

/// Frees a plan (NULL is fine); on CUDA, unloads its kernel's module if no
/// handle holds it any more.
FLASHJIT_API void flashjit_plan_destroy(flashjit_plan *plan);

/* ---------------------------------------------------------------------- */
/* Inspecting                                                              */
/* ---------------------------------------------------------------------- */

/** The tiling flashjit_forward (or, with spec->direction
 *  FLASHJIT_DIRECTION_BACKWARD, flashjit_backward) uses for \p spec on this
 *  problem: out = {block_m, block_n, warps, stages}: on CUDA a config tuned
 *  on this GPU for this problem class (memory or the disk cache) if any,
 *  else the heuristic. The first flashjit_forward of a new (spec, problem
 *  class, GPU) tunes on its inputs unless FLASHJIT_AUTOTUNE=0 or the stream
 *  is being captured; the backward never tunes on a call (`flashjit tune
 *  --backward` stores a config it then uses). */
FLASHJIT_API flashjit_status flashjit_chosen_config(
    flashjit_handle *handle, const flashjit_spec *spec, int64_t batch,
    int64_t heads, int64_t seq_len_q, int64_t seq_len_kv, int64_t out[4]);

/** Prints a stage of \p spec (its direction: the forward's kernel or the
 *  backward's three) compiled with the default tiling: "attn", "tile"
 *  (or its old name "tiled"), "gpu", "llvm", "ptx", "cpu-llvm", or "cubin"
 *  (binary; needs
 *  nvJitLink). \p arch: "sm_80", "sm_90a", ...; NULL means the handle's GPU
 *  on a CUDA handle, "sm_90a" on a CPU handle (neither needs a GPU for
 *  "ptx"). On success *out is a NUL-terminated buffer of *len bytes (not
 *  counting the NUL) that the caller frees with flashjit_free. */
FLASHJIT_API flashjit_status flashjit_emit(flashjit_handle *handle,
                                           const flashjit_spec *spec,
                                           const char *stage, const char *arch,
                                           char **out, size_t *len);

/** Frees a buffer returned by flashjit (NULL is fine). */
FLASHJIT_API void flashjit_free(void *buffer);

#ifdef __cplusplus
}
#endif

#endif /* FLASHJIT_CAPI_FLASHJIT_H */
