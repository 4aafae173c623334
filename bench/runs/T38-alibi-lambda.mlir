{
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %v0 = arith.constant 1 : index
    %v1 = arith.addi %h, %v0 : index
    %v2 = arith.constant 0xC1000000 : f32
    %v3 = arith.index_cast %v1 : index to i32
    %v4 = arith.sitofp %v3 : i32 to f32
    %v5 = arith.mulf %v2, %v4 : f32
    %v6 = arith.constant 0x41800000 : f32
    %v7 = arith.divf %v5, %v6 : f32
    %v8 = math.exp2 %v7 : f32
    %v9 = arith.subi %j, %i : index
    %v10 = arith.index_cast %v9 : index to i32
    %v11 = arith.sitofp %v10 : i32 to f32
    %v12 = arith.mulf %v8, %v11 : f32
    %v13 = arith.addf %s, %v12 : f32
    attn.yield %v13 : f32
  }
