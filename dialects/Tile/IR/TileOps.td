//===- TileOps.td - The tile dialect: tiles of a FlashAttention program ---===//
//
// The shared stage of flashjit's pipeline: both the CPU execution mode and
// the GPU lowering compile it. Values are tiles (statically shaped builtin
// tensors); ops load and store tiles of strided global tensors, multiply
// them, reduce rows and broadcast them back. Elementwise arithmetic and math
// on tiles are the arith and math dialects' ops on tensors; the loop over KV
// (or Q) blocks is an scf.for carrying tiles.
//
//===----------------------------------------------------------------------===//

#ifndef FLASHJIT_TILE_OPS
#define FLASHJIT_TILE_OPS

include "mlir/IR/OpBase.td"
include "mlir/IR/CommonTypeConstraints.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Tile_Dialect : Dialect {
  let name = "tile";
  let cppNamespace = "::flashjit::tile";
  let summary = "Tiles of a FlashAttention program, shared by the CPU and GPU";
  let description = [{
    The stage where every arithmetic decision of a flashjit kernel is made.

    **The contract.** Everything that decides *what* is computed is written
    here, by the tiling passes: which KV (or Q) blocks a program visits (the
    band of a causal or sliding-window mask, the blocks a BCSR layout
    lists), the masks (iota tiles, compares and selects), the online-softmax
    update and the scale, the order of the reductions' operands, and every
    rounding point (`arith.truncf` of a tile: P to bf16 before P V, O to the
    element type before its store). The passes after this stage decide only
    *where data lives and when things happen*: register layouts (mma.sync
    fragments, warpgroup accumulators), shared-memory staging and swizzles,
    asynchronous copies and software pipelining, warp roles and register
    budgets. They may rewrite an op into one that computes the same value
    bit for bit (skip `O * 1`, split a dot's columns over programs), never
    change the arithmetic. Left to each implementation, and documented where
    it is made: the association of f32 sums (a dot's K-sum, a row sum, and
    a running row sum `l = l * a + rowsum(p)` that the GPU keeps per lane
    and combines after its loop, FlashAttention-2's order), and the
    precision of math functions (the GPU's math.exp2, log2 and tanh are the
    hardware's approximations, ex2 / lg2 / tanh.approx; the CPU's are
    libm-exact). The CPU execution mode lowers this same IR to loops, so the
    CPU tests check what the GPU runs.

    **Values.** A tile is a `tensor<RxCxT>` or `tensor<RxT>` with a static
    shape: the tiles of Q, K, V in their element type, S and O in f32, the
    per-row statistics m, l as rank-1 tiles, masks as i1 tiles. Elementwise
    ops are `arith.*` / `math.*` on tiles; a scalar enters a tile through
    `tile.splat`, a constant through `arith.constant dense<...>`.

    ```mlir
    %q = tile.load %Q[%qoff] rows %m0 of %nq stride %sq
        : memref<?xbf16> -> tensor<64x64xbf16>
    %r:3 = scf.for %t = %lo to %hi step %c1
        iter_args(%o = %o0, %m = %m0v, %l = %l0) -> (...) {
      %k = tile.load %K[%koff] rows %n0 of %nkv stride %sk : ...
      %s = tile.dot %q, %k {transpose_rhs}
          : tensor<64x64xbf16>, tensor<64x64xbf16> -> tensor<64x64xf32>
      %mx = tile.reduce "max" %s dim 1 : tensor<64x64xf32> -> tensor<64xf32>
      ...
      %p16 = arith.truncf %p : tensor<64x64xf32> to tensor<64x64xbf16>
      %o2 = tile.dot %p16, %v acc %os : tensor<64x64xf32> : ...
      scf.yield %o2, %mn, %ln : ...
    }
    ```
  }];
}

class Tile_Op<string mnemonic, list<Trait> traits = []>
    : Op<Tile_Dialect, mnemonic, traits>;

/// A tile: a statically shaped tensor of rank 1 or 2.
def Tile_Tile : Type<And<[HasStaticShapePred, HasAnyRankOfPred<[1, 2]>,
                          IsTensorTypePred]>,
                     "a tile (static tensor of rank 1 or 2)",
                     "::mlir::RankedTensorType">;
def Tile_Matrix : Type<And<[HasStaticShapePred, HasAnyRankOfPred<[2]>,
                            IsTensorTypePred]>,
                       "a 2-D tile", "::mlir::RankedTensorType">;
def Tile_Buffer : MemRefRankOf<[BF16, F16, F32, I32, I64], [1]>;

/// The addressing every global access shares: element (r, c) of the tile is
/// base[offset + (row0 + r) * stride + c] (rank 1: base[offset + row0 + r]),
/// present iff row0 + r < rows. Loads and stores may also take `group %G
/// stride %gs`: row p = row0 + r is then row p / G of head p % G, at
/// base[offset + (p / G) * stride + (p % G) * gs + c] (rank 1: stride 1):
/// the rows of G heads interleaved in one tile (GQA packing).
class Tile_GlobalAccessOp<string mnemonic, list<Trait> traits = []>
    : Tile_Op<mnemonic, traits> {
  let hasVerifier = 1;
}

def Tile_LoadOp : Tile_GlobalAccessOp<"load", [AttrSizedOperandSegments]> {
  let summary = "Loads a tile of a strided global tensor, rows predicated";
  let description = [{
    Element (r, c) of the result is `base[offset + (row0 + r) * stride + c]`
    when `row0 + r < rows`, else 0 (a rank-1 tile reads
    `base[offset + row0 + r]`, no stride). So tails past the sequence are
    zeros, never garbage. The element type is the buffer's.

    ```mlir
    %k = tile.load %K[%off] rows %n0 of %nkv stride %sn
        : memref<?xbf16> -> tensor<64x96xbf16>
    %lse = tile.load %LSE[%off] rows %m0 of %nq
        : memref<?xf32> -> tensor<64xf32>
    ```

    With `quad_order` (a 2-D tile of whole 16-column groups) the row's
    columns are stored in quad order, as `tile.atomic_add` with it wrote
    them: column c is at `quadColumn(c)` of the row (see there).
  }];
  let arguments = (ins Arg<Tile_Buffer, "", [MemRead]>:$base, Index:$offset,
                   Index:$row0, Index:$rows, Optional<Index>:$stride,
                   Optional<Index>:$group, Optional<Index>:$group_stride,
                   UnitAttr:$quad_order);
  let results = (outs Tile_Tile:$result);
  let assemblyFormat = [{
    $base `[` $offset `]` `rows` $row0 `of` $rows (`stride` $stride^)?
    (`group` $group^ `stride` $group_stride)?
    attr-dict `:` type($base) `->` type($result)
  }];
}

def Tile_StoreOp : Tile_GlobalAccessOp<"store", [AttrSizedOperandSegments]> {
  let summary = "Stores a tile into a strided global tensor, rows predicated";
  let description = [{
    Writes element (r, c) of `value` to `base[offset + (row0 + r) * stride
    + c]` for the rows with `row0 + r < rows`; the others are not written.
    The tile's element type must be the buffer's (round first with
    `arith.truncf`: the rounding point is explicit).

    ```mlir
    tile.store %o16, %O[%off] rows %m0 of %nq stride %sn
        : tensor<64x96xbf16>, memref<?xbf16>
    ```
  }];
  let arguments = (ins Tile_Tile:$value, Arg<Tile_Buffer, "", [MemWrite]>:$base,
                   Index:$offset, Index:$row0, Index:$rows,
                   Optional<Index>:$stride, Optional<Index>:$group,
                   Optional<Index>:$group_stride);
  let assemblyFormat = [{
    $value `,` $base `[` $offset `]` `rows` $row0 `of` $rows
    (`stride` $stride^)? (`group` $group^ `stride` $group_stride)?
    attr-dict `:` type($value) `,` type($base)
  }];
}

def Tile_AtomicAddOp : Tile_GlobalAccessOp<"atomic_add"> {
  let summary = "Adds an f32 tile into a global accumulator, atomically";
  let description = [{
    `base[offset + (row0 + r) * stride + c] += value[r][c]` for the rows with
    `row0 + r < rows`, each add atomic (programs that run at once may add
    into the same elements; the order of their adds is not fixed).

    ```mlir
    tile.atomic_add %dq, %DQACC[%off] rows %m0 of %nq stride %sn
        : tensor<64x128xf32>, memref<?xf32>
    ```

    With `quad_order` (a 2-D tile of whole 16-column groups) column c is
    added at column `quadColumn(c)` of the row instead: inside each group
    of 16, columns 2i, 2i+1, 2i+8 and 2i+9 (i < 4) are adjacent, at 4i ..
    4i+3, the four values one thread of a tensor-core MMA holds of a row,
    so that one 16-byte reduction adds them; a `tile.load` with
    `quad_order` reads them back in column order.
  }];
  let arguments = (ins Tile_Tile:$value,
                   Arg<Tile_Buffer, "", [MemRead, MemWrite]>:$base,
                   Index:$offset, Index:$row0, Index:$rows,
                   Optional<Index>:$stride, UnitAttr:$quad_order);
  let assemblyFormat = [{
    $value `,` $base `[` $offset `]` `rows` $row0 `of` $rows
    (`stride` $stride^)? attr-dict `:` type($value) `,` type($base)
  }];
}

def Tile_DotOp : Tile_Op<"dot", [Pure]> {
  let summary = "Tile matrix product with f32 accumulation";
  let description = [{
    `result = op(lhs) op(rhs) (+ acc)`, op transposing where
    `transpose_lhs` / `transpose_rhs` is set: lhs M x K (K x M transposed),
    rhs K x N (N x K transposed), result and acc M x N f32. Operands are
    bf16, f16 (both the same) or f32; products and sums are f32, as on the
    tensor cores (the order of the K-sum is the implementation's).

    ```mlir
    %s = tile.dot %q, %k {transpose_rhs}
        : tensor<64x96xbf16>, tensor<32x96xbf16> -> tensor<64x32xf32>
    %o = tile.dot %p, %v acc %o0 : tensor<64x96xf32>
        : tensor<64x32xbf16>, tensor<32x96xbf16> -> tensor<64x96xf32>
    ```
  }];
  let arguments = (ins Tile_Matrix:$lhs, Tile_Matrix:$rhs,
                   Optional<Tile_Matrix>:$acc, UnitAttr:$transpose_lhs,
                   UnitAttr:$transpose_rhs);
  let results = (outs Tile_Matrix:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs (`acc` $acc^ `:` type($acc))? attr-dict `:` type($lhs)
    `,` type($rhs) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Tile_ReduceOp : Tile_Op<"reduce", [Pure]> {
  let summary = "Reduces a 2-D f32 tile along one dimension: max or sum";
  let description = [{
    `kind` is "max" (IEEE maxNum: a NaN operand is ignored unless all are
    NaN; the max of an all -inf row is -inf) or "sum". `dim` is the
    dimension reduced: 1 gives one value per row, 0 one per column.

    ```mlir
    %mx = tile.reduce "max" %s dim 1 : tensor<64x32xf32> -> tensor<64xf32>
    ```
  }];
  let arguments = (ins StrAttr:$kind, Tile_Matrix:$value, I64Attr:$dim);
  let results = (outs Tile_Tile:$result);
  let assemblyFormat = [{
    $kind $value `dim` $dim attr-dict `:` type($value) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Tile_BroadcastOp : Tile_Op<"broadcast", [Pure]> {
  let summary = "Repeats a rank-1 tile along a new dimension";
  let description = [{
    `dim` is the new dimension: with dim 1, `result[r][c] = value[r]` (a
    per-row value over the columns); with dim 0, `result[r][c] = value[c]`.

    ```mlir
    %mb = tile.broadcast %m dim 1 : tensor<64xf32> -> tensor<64x32xf32>
    ```
  }];
  let arguments = (ins Tile_Tile:$value, I64Attr:$dim);
  let results = (outs Tile_Matrix:$result);
  let assemblyFormat = [{
    $value `dim` $dim attr-dict `:` type($value) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Tile_SplatOp : Tile_Op<"splat", [Pure]> {
  let summary = "A tile whose every element is one scalar";
  let description = [{
    ```mlir
    %sc = tile.splat %scale : f32 -> tensor<64x32xf32>
    ```
  }];
  let arguments = (ins AnyTypeOf<[AnyFloat, AnySignlessInteger]>:$value);
  let results = (outs Tile_Tile:$result);
  let assemblyFormat = "$value attr-dict `:` type($value) `->` type($result)";
  let hasVerifier = 1;
}

def Tile_IotaOp : Tile_Op<"iota", [Pure]> {
  let summary = "The row or column index of each element, as i32";
  let description = [{
    `result[r][c] = r` with dim 0, `= c` with dim 1 (rank 1: `result[r] =
    r`, dim 0). Masks add a program's first row or key to it and compare.

    ```mlir
    %cols = tile.iota dim 1 : tensor<64x32xi32>
    ```
  }];
  let arguments = (ins I64Attr:$dim);
  let results = (outs Tile_Tile:$result);
  let assemblyFormat = "`dim` $dim attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Tile_GatherOp : Tile_Op<"gather"> {
  let summary = "Each element read from a buffer at its own index";
  let description = [{
    `result[e] = base[index[e]]` for every element e of the i32 tile
    `index`: a score modifier's load of a captured tensor (a bias table, a
    segment id) on a whole score tile, or (i32) a block class a mask's
    block lists read. Indices outside the buffer are the
    description's fault, as any out-of-bounds load would be.

    ```mlir
    %bias = tile.gather %table[%idx] : memref<?xf32>, tensor<64x32xi32>
        -> tensor<64x32xf32>
    ```
  }];
  let arguments = (ins Arg<MemRefRankOf<[F32, I32, I64], [1]>, "",
                       [MemRead]>:$base,
                   Tile_Tile:$index);
  let results = (outs Tile_Tile:$result);
  let assemblyFormat = [{
    $base `[` $index `]` attr-dict `:` type($base) `,` type($index) `->`
    type($result)
  }];
  let hasVerifier = 1;
}

def Tile_ScatterAddOp : Tile_Op<"scatter_add"> {
  let summary = "Adds each element into a buffer at its own index, atomically";
  let description = [{
    `base[index[e]] += value[e]` for every element e of the f32 tile
    `value` and the i32 tile `index` of its shape, each add atomic (programs
    that run at once, and elements of one tile, may add into the same
    element; the order of the adds is not fixed): the gradient of a
    captured tensor that a tile.gather read, accumulated over the score
    tiles. Indices outside the buffer are the description's fault, as for
    tile.gather.

    An i64 tile into an i64 buffer adds integers: the fixed-point words of
    a deterministic gradient (attn.flash_bwd's `deterministic`; the tiling
    rounds each element to them), whose sum does not depend on the order
    of the adds, so it is the same bits run to run.

    ```mlir
    tile.scatter_add %g, %dtable[%idx]
        : tensor<64x32xf32>, memref<?xf32>, tensor<64x32xi32>
    tile.scatter_add %hi, %dtable_hi[%idx]
        : tensor<64x32xi64>, memref<?xi64>, tensor<64x32xi32>
    ```
  }];
  let arguments = (ins Tile_Tile:$value,
                   Arg<MemRefRankOf<[F32, I64], [1]>, "",
                       [MemRead, MemWrite]>:$base,
                   Tile_Tile:$index);
  let assemblyFormat = [{
    $value `,` $base `[` $index `]` attr-dict `:` type($value) `,`
    type($base) `,` type($index)
  }];
  let hasVerifier = 1;
}

def Tile_ScatterOp : Tile_Op<"scatter"> {
  let summary = "Writes each element where its mask holds, at its own index";
  let description = [{
    `base[index[e]] = value[e]` for every element e whose `mask[e]` is true;
    the others write nothing. Elements written by more than one program or
    element must hold the same value (the writes are not ordered). The
    block classification of a mask_mod (role "mask_blocks") lists each kept
    KV block at its q block's running count this way.

    ```mlir
    tile.scatter %entry, %INDICES[%pos] if %kept
        : tensor<4xi32>, memref<?xi32>, tensor<4xi32>, tensor<4xi1>
    ```
  }];
  let arguments = (ins Tile_Tile:$value,
                   Arg<MemRefRankOf<[F32, I32], [1]>, "", [MemWrite]>:$base,
                   Tile_Tile:$index, Tile_Tile:$mask);
  let assemblyFormat = [{
    $value `,` $base `[` $index `]` `if` $mask attr-dict `:` type($value) `,`
    type($base) `,` type($index) `,` type($mask)
  }];
  let hasVerifier = 1;
}

#endif // FLASHJIT_TILE_OPS
