{
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index, %c0: memref<?xf32>):
    %v0 = memref.load %c0[%h] : memref<?xf32>
    %v1 = arith.subi %j, %i : index
    %v2 = arith.index_cast %v1 : index to i32
    %v3 = arith.sitofp %v2 : i32 to f32
    %v4 = arith.mulf %v0, %v3 : f32
    %v5 = arith.addf %s, %v4 : f32
    attn.yield %v5 : f32
  }
