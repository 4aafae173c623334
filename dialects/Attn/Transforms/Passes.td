//===- Passes.td - flashjit's attn passes ------------------*- tablegen -*-===//

#ifndef FLASHJIT_ATTN_PASSES
#define FLASHJIT_ATTN_PASSES

include "mlir/Pass/PassBase.td"

def TileAttention : Pass<"flashjit-tile-attention", "mlir::ModuleOp"> {
  let summary = "Lower attn.flash_fwd into the tiled FlashAttention-2 loop";
  let description = [{
    Replaces each `attn.flash_fwd @f` by `func.func @f`, the body of one
    program written in the tile dialect (the stage the CPU and the GPU
    both compile; see TileOps.td for the contract): it owns a block of `block-m` query rows of one (batch, head),
    walks the KV sequence in blocks of `block-n` rows with an `scf.for`
    (or, when block-sparse, only the blocks the run-time layout lists), keeps
    the running max m, running sum l and the fp32 accumulator O, rescales by
    exp2(m_old - m_new), and writes O / l and lse = m + log(l) at the end.
    Causal and sliding-window masks skip the blocks outside the band and
    apply the element mask only in blocks that straddle its edge.
    The argument list is documented in kernels/KernelABI.h.
  }];
  let dependentDialects = ["mlir::func::FuncDialect", "mlir::scf::SCFDialect",
                           "mlir::arith::ArithDialect",
                           "mlir::math::MathDialect",
                           "mlir::memref::MemRefDialect",
                           "::flashjit::tile::TileDialect"];
  let options = [
    Option<"blockM", "block-m", "int64_t", "64",
           "Br: query rows per program">,
    Option<"blockN", "block-n", "int64_t", "64",
           "Bc: key rows per iteration of the KV loop">,
    Option<"kvSplit", "kv-split", "bool", "false",
           "split-KV (FlashDecoding): @f writes the partials of one of "
           "kv_splits runs of the KV blocks (GQA-packed when gqa > 1 and "
           "dense), @f_combine merges them by their lse "
           "(kernels/KernelABI.h, abi::split)">,
    Option<"overlapSoftmax", "overlap-softmax", "bool", "false",
           "software-pipelined KV loop: iteration t issues S = Q K^T of "
           "block t + 1 before the softmax of block t, which then runs "
           "while the tensor cores compute it (the first block's S before "
           "the loop)">,
    Option<"biasProduct", "bias-product", "bool", "false",
           "with overlap-softmax and bf16 head dims up to 128: a score "
           "bias affine in the block's row and column (ALiBi's) becomes one "
           "more k-step of Q K^T on constant operands (BiasProduct.h), whose "
           "16 x Bc tile takes a shared slot on the GPU">,
    Option<"softmaxLead", "softmax-lead", "int64_t", "1",
           "with overlap-softmax: how many blocks ahead of its softmax a "
           "block's S = Q K^T is issued: 1, or 2 (S of block t + 2 before "
           "the softmax of block t + 1, the loop carrying that block's raw "
           "S, so that a softmax never waits for its own product; "
           "bias-product is then not taken)">,
  ];
}

def TileAttentionBackward
    : Pass<"flashjit-tile-attention-backward", "mlir::ModuleOp"> {
  let summary = "Lower attn.flash_bwd into the tiled FlashAttention-2 backward";
  let description = [{
    Replaces each `attn.flash_bwd @f` by three functions in the tile dialect
    (the stage the CPU and the GPU both compile; see TileOps.td for the
    contract) that share one argument list (kernels/KernelABI.h, namespace
    bwd): `@f_preprocess` (one program per kRowBlockRows = 64 rows of one
    (batch, head)) writes D = rowsum(dO * O) and -lse * log2(e) into the
    delta workspace; `@f` (one program per KV block of `block-n` keys and
    (batch, KV head)) keeps dK and dV of its keys in f32 tiles while it
    walks, for every query head of the GQA group, the Q blocks of `block-m`
    rows that see its keys (the band, or the KV-major transposed layout when
    block-sparse), recomputing P = exp2(S * scale * log2(e) - lse * log2(e))
    (0 where masked or lse = -inf), rounding it to the element type, and
    accumulating dV += P^T dO, dS = P * (dO V^T - D) (from the rounded P,
    rounded in turn), dK += dS^T Q. dQ, by the op's `deterministic`: false
    (the default), `@f_preprocess` also zeroes the f32 dq_accum workspace,
    `@f` adds each block pair's dS K into it with `tile.atomic_add`, and
    `@f_dq` (role "dq_convert", kRowBlockRows rows per program) writes dQ =
    dq_accum * scale; true, `@f_dq` (role "dq", one program per Q block of
    `dq-block-m` rows) walks the KV blocks of `dq-block-n` keys its rows
    see, recomputes P and dS, and sums dQ = dS K: a separate pass over Q
    blocks, deterministic by construction and free of atomics. dK and dQ
    are scaled at the end. Every function's `attn.kernel` carries its role,
    its tiling and `deterministic`.
  }];
  let dependentDialects = ["mlir::func::FuncDialect", "mlir::scf::SCFDialect",
                           "mlir::arith::ArithDialect",
                           "mlir::math::MathDialect",
                           "mlir::memref::MemRefDialect",
                           "::flashjit::tile::TileDialect"];
  let options = [
    Option<"blockM", "block-m", "int64_t", "64",
           "Br: query rows per Q block (the main loop's streamed block)">,
    Option<"blockN", "block-n", "int64_t", "64",
           "Bc: keys per KV block (the main loop's program)">,
    Option<"dqBlockM", "dq-block-m", "int64_t", "0",
           "Br': query rows per program of the deterministic dQ pass "
           "(0: block-m)">,
    Option<"dqBlockN", "dq-block-n", "int64_t", "0",
           "Bc': keys per step of the deterministic dQ pass (0: block-n)">,
    Option<"dqQuadOrder", "dq-quad-order", "bool", "false",
           "atomic dQ: dq_accum's rows in quad order (tile.atomic_add's and "
           "the conversion's tile.load's `quad_order`) where dqk is a "
           "multiple of 16">,
    Option<"warps", "warps", "int64_t", "0",
           "the GPU's warps: with dq-block-m/n 0, the dQ pass's tiles are "
           "dqPassTiles(dqk, sparse block, Br x Bc, warps) of "
           "kernels/GpuGeometry.h, as the GPU launches them (0: Br x Bc)">,
  ];
}

#endif // FLASHJIT_ATTN_PASSES
