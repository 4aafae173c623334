{
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %le = arith.cmpi sle, %j, %i : index
    %d = arith.subi %i, %j : index
    %di = arith.index_cast %d : index to i32
    %df = arith.sitofp %di : i32 to f32
    %k = arith.constant -0.0625 : f32
    %bias = arith.mulf %df, %k : f32
    %a = arith.addf %s, %bias : f32
    %half = arith.constant 0.5 : f32
    %b2 = arith.mulf %s, %half : f32
    %y = arith.select %le, %a, %b2 : f32
    attn.yield %y : f32
}
