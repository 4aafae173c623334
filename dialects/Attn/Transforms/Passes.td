//===- Passes.td - flashjit's attn passes ------------------*- tablegen -*-===//

#ifndef FLASHJIT_ATTN_PASSES
#define FLASHJIT_ATTN_PASSES

include "mlir/Pass/PassBase.td"

def TileAttention : Pass<"flashjit-tile-attention", "mlir::ModuleOp"> {
  let summary = "Lower attn.flash_fwd into the tiled FlashAttention-2 loop";
  let description = [{
    Replaces each `attn.flash_fwd @f` by `func.func @f`, the body of one
    program: it owns a block of `block-m` query rows of one (batch, head),
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
                           "mlir::memref::MemRefDialect"];
  let options = [
    Option<"blockM", "block-m", "int64_t", "64",
           "Br: query rows per program">,
    Option<"blockN", "block-n", "int64_t", "64",
           "Bc: key rows per iteration of the KV loop">,
  ];
}

#endif // FLASHJIT_ATTN_PASSES
