// RUN: flashjit-opt %s --flashjit-tile-attention="block-m=64 block-n=32 overlap-softmax=true half-softmax=true" | FileCheck %s
// RUN: %flashjit compile --head-dim 128 --score-mod softcap:30 --causal --target sm_90a --emit gpu | FileCheck %s --check-prefix=GPU

// The half-precision softmax of a bf16 softcap (TileAttentionSoftmax.cpp,
// halfExponentials): x = S * (scale / C) in f32, then tanh, the row max,
// the exponent t f - m and exp2 on f16 tiles; the row max of the f16 tile
// (widened) is rounded to f16 before the max's f32 chain, so P's shift is
// exact in f16; P is widened to f32 for the row sum and rounded to bf16
// for P V. The same in the first block's softmax (before the loop) and in
// the loop's.
// CHECK-LABEL: func.func @attention(
// CHECK: %[[X:.*]] = arith.mulf %{{.*}}, %{{.*}} : tensor<64x32xf32>
// CHECK: %[[XH:.*]] = arith.truncf %[[X]] : tensor<64x32xf32> to tensor<64x32xf16>
// CHECK: %[[T:.*]] = math.tanh %[[XH]] : tensor<64x32xf16>
// CHECK: %[[TM:.*]] = scf.if %{{.*}} -> (tensor<64x32xf16>)
// CHECK: arith.select %{{.*}}, %[[T]], %{{.*}} : tensor<64x32xi1>, tensor<64x32xf16>
// CHECK: %[[MX:.*]] = tile.reduce "max" %[[TM]] dim 1 : tensor<64x32xf16> -> tensor<64xf32>
// CHECK: %[[MF:.*]] = arith.mulf %[[MX]], %{{.*}} : tensor<64xf32>
// CHECK: %[[MH:.*]] = arith.truncf %[[MF]] : tensor<64xf32> to tensor<64xf16>
// CHECK: arith.extf %[[MH]] : tensor<64xf16> to tensor<64xf32>
// CHECK: %[[NEGM:.*]] = arith.truncf %{{.*}} : tensor<64x32xf32> to tensor<64x32xf16>
// CHECK: %[[E:.*]] = math.fma %[[TM]], %{{.*}}, %[[NEGM]] : tensor<64x32xf16>
// CHECK: %[[PH:.*]] = math.exp2 %[[E]] : tensor<64x32xf16>
// CHECK: %[[P:.*]] = arith.extf %[[PH]] : tensor<64x32xf16> to tensor<64x32xf32>
// CHECK: tile.reduce "sum" %[[P]] dim 1 : tensor<64x32xf32> -> tensor<64xf32>
// CHECK: arith.truncf %[[P]] : tensor<64x32xf32> to tensor<64x32xbf16>
// CHECK: scf.for
// CHECK: math.tanh %{{.*}} : tensor<64x32xf16>
// CHECK: math.exp2 %{{.*}} : tensor<64x32xf16>
// CHECK-NOT: math.tanh %{{.*}} : tensor<64x32xf32>

// On the GPU (the sm_90a default tiling of d = 128: the overlapped loop)
// the f16 tiles' math takes the registers in pairs (adjacent columns of
// one row): one f16x2 instruction for two scores; the row max's pairs by
// f16x2 maxima (TileToGPUHalf.cpp).
// GPU-LABEL: gpu.func @attention(
// GPU: llvm.inline_asm "tanh.approx.f16x2 $0, $1;", "=r,r"
// GPU: llvm.intr.maxnum({{.*}}) : (vector<2xf16>, vector<2xf16>) -> vector<2xf16>
// GPU: llvm.intr.fma({{.*}}) : (vector<2xf16>, vector<2xf16>, vector<2xf16>) -> vector<2xf16>
// GPU: llvm.inline_asm "ex2.approx.f16x2 $0, $1;", "=r,r"
// GPU-NOT: tanh.approx.f32
module {
attn.flash_fwd @attention {element_type = bf16, gqa = 1 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "causal", sparse_block = 0 : i64} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %c = arith.constant 3.000000e+01 : f32
  %x = arith.divf %s, %c : f32
  %t = math.tanh %x : f32
  %y = arith.mulf %t, %c : f32
  attn.yield %y : f32
}
}
