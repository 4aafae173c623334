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

include "mlir/IR/OpBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/BuiltinAttributes.td"

def Attn_Dialect : Dialect {
  let name = "attn";
  let cppNamespace = "::flashjit::attn";
  let summary = "Descriptions of FlashAttention-style kernels";
  let description = [{
    The `attn` dialect holds what a user asks flashjit to compile: one op per
    kernel, carrying head dims, element type, mask kind, GQA group size and
    the block-sparse block size. `flashjit-tile-attention` lowers each op
    into a function holding the tiled FlashAttention-2 loop.
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
    DefaultValuedAttr<I64Attr, "0">:$sparse_block
  ), extraArgs);
  let assemblyFormat = "$sym_name attr-dict";
  let hasVerifier = 1;
}

def Attn_FlashFwdOp : Attn_KernelDescriptionOp<"flash_fwd"> {
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

    ```mlir
    attn.flash_fwd @attention {element_type = bf16, gqa = 1 : i64,
        head_dim_qk = 96 : i64, head_dim_v = 96 : i64, mask = "causal",
        sparse_block = 0 : i64}
    ```
  }];
}

def Attn_FlashBwdOp : Attn_KernelDescriptionOp<"flash_bwd",
    (ins DefaultValuedAttr<BoolAttr, "false">:$deterministic)> {
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
  }];
}

#endif // FLASHJIT_ATTN_OPS
