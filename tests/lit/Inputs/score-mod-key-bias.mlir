{
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index, %t: memref<?xf32>):
  %x = memref.load %t[%j] : memref<?xf32>
  %y = arith.addf %s, %x : f32
  attn.yield %y : f32
}
