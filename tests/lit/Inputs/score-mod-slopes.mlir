{
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index, %t: memref<?xf32>):
  %slope = memref.load %t[%h] : memref<?xf32>
  %d = arith.subi %j, %i : index
  %di = arith.index_cast %d : index to i32
  %df = arith.sitofp %di : i32 to f32
  %x = arith.mulf %slope, %df : f32
  %y = arith.addf %s, %x : f32
  attn.yield %y : f32
}
