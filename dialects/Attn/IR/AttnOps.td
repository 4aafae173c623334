//===- AttnOps.td - The attn dialect: attention descriptions -*- tablegen -*-===//
//
// The top of flashjit's pipeline: an attention kernel described by its
// compile-time fields only. Run-time values (batch, heads, sequence lengths,
// scale, window sizes, the block-sparse layout) are kernel arguments that the
// tiling pass introduces.
//
//===----------------------------------------------------------------------===//

#ifndef FLASHJIT_ATTN_OPS
#define FLASHJIT_ATTN_OPS

include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/OpBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/BuiltinAttributes.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Attn_Dialect : Dialect {
  let name = "attn";
  let cppNamespace = "::flashjit::attn";
  let summary = "Descriptions of FlashAttention-style kernels";
  let description = [{
    The `attn` dialect holds what a user asks flashjit to compile: one op per
    kernel, carrying head dims, element type, mask kind, GQA group size and
    the block-sparse block size. `flashjit-tile-attention` lowers each op
    into a function holding the tiled FlashAttention-2 loop, written in the
    `tile` dialect and marked with an `attn.kernel = #attn.kernel<...>`
    attribute: the description, the tiling and the function's role.
  }];
  let useDefaultAttributePrinterParser = 1;
  let hasOperationAttrVerify = 1;
  // A score modifier's body is arith / math ops and loads of captured
  // tensors.
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::math::MathDialect",
                           "::mlir::memref::MemRefDialect"];
}

/// A boolean parameter printed and parsed as `true` / `false`.
def Attn_BoolParameter : AttrOrTypeParameter<"bool", "a boolean"> {
  let parser = [{ [&]() -> ::mlir::FailureOr<bool> {
    if (::mlir::succeeded($_parser.parseOptionalKeyword("true")))
      return true;
    if (::mlir::succeeded($_parser.parseOptionalKeyword("false")))
      return false;
    $_parser.emitError($_parser.getCurrentLocation(), "expected true or false");
    return ::mlir::failure();
  }() }];
  let printer = [{ $_printer << ($_self ? "true" : "false") }];
}

def Attn_KernelAttr : AttrDef<Attn_Dialect, "Kernel"> {
  let mnemonic = "kernel";
  let summary = "What a tiled kernel function computes, and how it is tiled";
  let description = [{
    The contract between the tiling passes and every later stage, on each
    function they make (`attn.kernel = #attn.kernel<...>`). `role` says
    which program the function is: "forward" (one Q block of the forward),
    "forward_split" and "combine" (the split-KV forward's partial and its
    lse merge, kernels/KernelABI.h), "mask_blocks" and "mask_blocks_list"
    (a mask_mod's block classification and its lists, abi::blocks), or one of the backward's "preprocess", "main" (dK, dV of one KV block),
    "dq" (the deterministic dQ pass) or "dq_convert" (atomic dQ's
    conversion). The other fields are the description's (attn.flash_fwd /
    attn.flash_bwd) and the tile sizes Br x Bc. `score_mod` (forward only,
    absent when the description has no score_mod region) names the
    modifier the function has inlined: the named variant its region is
    ("softcap:20", "alibi:8"; FlashFwdOp::namedScoreMod), or "custom" for
    a region that is none of them, so that a reader of the tiled function
    (`flashjit run --input`) checks it against the reference of the same
    modifier. `mask_mod` is "custom" when the function has inlined the
    description's mask_mod region ("" without one). The verifier checks
    every field, so a later stage never meets a head dim of 0 or an unknown
    mask.

    ```mlir
    func.func @attention(...) attributes {attn.kernel = #attn.kernel<
        role = "forward", head_dim_qk = 64, head_dim_v = 64,
        element_type = bf16, mask = "causal", gqa = 1, sparse_block = 0,
        block_m = 64, block_n = 64, deterministic = false,
        score_mod = "alibi:8">}
    ```
  }];
  let parameters = (ins
    StringRefParameter<"the function's role">:$role,
    "int64_t":$head_dim_qk,
    "int64_t":$head_dim_v,
    "::mlir::Type":$element_type,
    StringRefParameter<"none, causal or sliding_window">:$mask,
    "int64_t":$gqa,
    "int64_t":$sparse_block,
    "int64_t":$block_m,
    "int64_t":$block_n,
    Attn_BoolParameter:$deterministic,
    StringRefParameter<"the inlined score modifier, \"\" for none",
                       [{""}]>:$score_mod,
    StringRefParameter<"\"custom\" when a mask_mod region is inlined, "
                       "\"\" for none", [{""}]>:$mask_mod
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Whether the function belongs to the backward pass.
    bool isBackward() const {
      return getRole() != "forward" && getRole() != "forward_split" &&
             getRole() != "combine" && getRole() != "mask_blocks" &&
             getRole() != "mask_blocks_list";
    }
  }];
}

class Attn_Op<string mnemonic, list<Trait> traits = []>
    : Op<Attn_Dialect, mnemonic, traits>;

/// The fields every kernel description carries (forward and backward alike):
/// one verifier checks them for both (verifyKernelDescription in AttnOps.cpp).
/// \p extraArgs are an op's own fields after them.
class Attn_KernelDescriptionOp<string mnemonic, dag extraArgs = (ins),
                               list<Trait> traits = []>
    : Attn_Op<mnemonic, !listconcat(traits, [Symbol])> {
  let arguments = !con((ins
    SymbolNameAttr:$sym_name,
    I64Attr:$head_dim_qk,
    I64Attr:$head_dim_v,
    TypeAttr:$element_type,
    StrAttr:$mask,
    DefaultValuedAttr<I64Attr, "1">:$gqa,
    DefaultValuedAttr<I64Attr, "0">:$sparse_block,
    DefaultValuedAttr<BoolAttr, "false">:$varlen
  ), extraArgs);
  let assemblyFormat = "$sym_name attr-dict";
  let hasVerifier = 1;
}

def Attn_FlashFwdOp : Attn_KernelDescriptionOp<"flash_fwd", (ins),
    [IsolatedFromAbove]> {
  let summary = "A FlashAttention forward kernel, described";
  let description = [{
    Declares the forward attention kernel `@sym_name`:
    O = softmax(scale * Q K^T + mask) V and lse = logsumexp of each score row,
    for Q of shape (B, H, Nq, head_dim_qk), K (B, H / gqa, Nkv, head_dim_qk)
    and V (B, H / gqa, Nkv, head_dim_v).

    `mask` is "none", "causal" or "sliding_window" (query i sees key j iff
    i + Nkv - Nq - left <= j <= i + Nkv - Nq + right, with left and right
    given at run time; causal is left = inf, right = 0). `sparse_block` > 0
    adds a run-time block-sparse layout (BCSR) over blocks of that many rows
    and columns; 0 means dense.

    `varlen = true` packs the batch's sequences one after another (Q of
    shape (total_q, H, head_dim_qk), K and V likewise over total_kv): the
    kernel reads sequence b's rows [cu_q[b], cu_q[b + 1]) from the run-time
    i32 offsets `cu_seqlens_q` and `cu_seqlens_kv`, and its masks and
    score_mod see positions and lengths within the sequence. Not with
    `sparse_block` > 0.

    ```mlir
    attn.flash_fwd @attention {element_type = bf16, gqa = 1 : i64,
        head_dim_qk = 96 : i64, head_dim_v = 96 : i64, mask = "causal",
        sparse_block = 0 : i64}
    ```

    The optional `score_mod` region rewrites each score before the mask
    and the softmax, as FlexAttention's score_mod does: it takes the scaled
    score `scale * q.k` (f32) and the element's batch, head, query index and
    key index (index), holds only arith and math ops, and yields the new
    score with `attn.yield`. The tiling runs it on whole score tiles, its
    index values as i32 tiles. After kv_idx it may take captured tensors
    (`memref<?xf32>`, flat: the region computes each index itself) and read
    them with `memref.load` at one index; the tiling gathers them per
    element from buffers that follow the kernel ABI's (the CPU mode only,
    for now: AttentionSpec::captures). The named variants (`--score-mod softcap:C`,
    `alibi:H`; kernels/AttentionSpec.h, ScoreMod) are regions that
    attnModuleText builds; `namedScoreMod` recognises them. Softcapping at
    20 (`--score-mod softcap:20`):

    ```mlir
    attn.flash_fwd @attention {element_type = bf16, ...} score_mod {
    ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
      %c = arith.constant 2.000000e+01 : f32
      %x = arith.divf %s, %c : f32
      %t = math.tanh %x : f32
      %y = arith.mulf %t, %c : f32
      attn.yield %y : f32
    }
    ```

    The optional `mask_mod` region decides which elements are attended to,
    as FlexAttention's mask_mod does: it takes the element's batch, head,
    query index and key index (index), then any captured tensors (as
    score_mod's, read with `memref.load`), holds the same ops, and yields
    an i1 with `attn.yield`: true keeps the score, false makes it -inf
    after the score_mod (a row that keeps no key gives 0 and lse -inf).
    Its captured tensors follow score_mod's in the kernel's arguments. A
    document mask over captured segment ids:

    ```mlir
    attn.flash_fwd @attention {element_type = bf16, ...} mask_mod {
    ^bb0(%b: index, %h: index, %i: index, %j: index, %seg: memref<?xf32>):
      %si = memref.load %seg[%i] : memref<?xf32>
      %sj = memref.load %seg[%j] : memref<?xf32>
      %keep = arith.cmpf oeq, %si, %sj : f32
      attn.yield %keep : i1
    }
    ```
  }];
  let regions = (region AnyRegion:$score_mod, AnyRegion:$mask_mod);
  let assemblyFormat =
      "$sym_name attr-dict (`score_mod` $score_mod^)? (`mask_mod` $mask_mod^)?";
  let extraClassDeclaration = [{
    /// Whether the description carries a score modifier.
    bool hasScoreMod() { return !getScoreMod().empty(); }
    /// Whether the description carries a mask modifier.
    bool hasMaskMod() { return !getMaskMod().empty(); }
    /// The named variant (AttentionSpec::scoreMod, e.g. "alibi:8") that
    /// the score_mod region is: "" without a region, std::nullopt for a
    /// region that is none of them. A region is a named variant when it is
    /// the region that variant's builder (attnModuleText) makes, up to
    /// value names and locations.
    std::optional<std::string> namedScoreMod();
  }];
}

def Attn_YieldOp : Attn_Op<"yield",
    [Pure, Terminator, ParentOneOf<["FlashFwdOp", "FlashBwdOp"]>]> {
  let summary = "The modified score (f32) of a score_mod region, or the "
                "verdict (i1) of a mask_mod region";
  let arguments = (ins AnyTypeOf<[F32, I1]>:$value);
  let assemblyFormat = "$value attr-dict `:` type($value)";
}

def Attn_FlashBwdOp : Attn_KernelDescriptionOp<"flash_bwd",
    (ins DefaultValuedAttr<BoolAttr, "false">:$deterministic,
         DefaultValuedAttr<I64Attr, "0">:$capture_grads),
    [IsolatedFromAbove]> {
  let summary = "A FlashAttention backward kernel, described";
  let description = [{
    Declares the backward pass `@sym_name` of the attention that the
    `attn.flash_fwd` with the same fields computes: from Q, K, V, O, dO and
    the forward's lse (f32, -inf for a row that sees no key), the gradients
    dQ (shaped as Q), dK (as K) and dV (as V), by recomputation:
    P = exp(scale * Q K^T - lse) (0 where masked or lse = -inf),
    D = rowsum(dO * O), dV = P^T dO, dS = P * (dO V^T - D),
    dQ = scale * dS K, dK = scale * dS^T Q; with GQA, dK and dV of a KV head
    sum over the query heads of its group. The fields mean what they mean
    for `attn.flash_fwd`; `flashjit-tile-attention-backward` lowers it.

    `deterministic` (default false) chooses how dQ is summed: false, the
    dK/dV loop adds dS K into an f32 workspace with atomic adds (fast; the
    order of the adds, so the last bits, may vary run to run); true, a
    separate pass over Q blocks (bit-identical run to run).

    ```mlir
    attn.flash_bwd @attention {element_type = bf16, gqa = 1 : i64,
        head_dim_qk = 96 : i64, head_dim_v = 96 : i64, mask = "causal",
        sparse_block = 0 : i64, deterministic = true}
    ```

    The optional `score_mod` region is the forward's (the same checks):
    P is recomputed from the modified scores, and the tiling derives
    d(score')/d(score) from the region's ops (forward-mode, ScoreMod.cpp)
    to carry dS back to the scaled score: dS = P * (dO V^T - D) *
    d(score')/d(score).

    `capture_grads` (default 0) names, bit c for captured tensor c, the
    captured tensors whose gradient the backward accumulates: every
    function takes a gradient buffer per captured tensor after the captured
    tensors (`capture_grad0`, ...), and the dK/dV loop adds G * d(score')/d
    x into it at the index each load x of that tensor read, G = P * (dO V^T
    - D) the gradient of the modified score (atomic adds; with
    `deterministic`, integer adds of fixed-point words into accumulators
    after the gradient buffers, which `@f_capture_grad<c>` functions then
    convert: kernels/KernelABI.h, abi::bwd::fixedPointCaptureGrads).


    The optional `mask_mod` region is the forward's: P is 0 where it
    yields false, so dS is too; its captured tensors take no gradient
    (capture_grads names only score_mod's).
  }];
  let regions = (region AnyRegion:$score_mod, AnyRegion:$mask_mod);
  let assemblyFormat =
      "$sym_name attr-dict (`score_mod` $score_mod^)? (`mask_mod` $mask_mod^)?";
  let extraClassDeclaration = [{
    /// Whether the description carries a score modifier.
    bool hasScoreMod() { return !getScoreMod().empty(); }
    /// Whether the description carries a mask modifier.
    bool hasMaskMod() { return !getMaskMod().empty(); }
    /// As FlashFwdOp::namedScoreMod.
    std::optional<std::string> namedScoreMod();
  }];
}

#endif // FLASHJIT_ATTN_OPS
