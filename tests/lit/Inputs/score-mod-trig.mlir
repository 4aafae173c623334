{
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %ji = arith.index_cast %j : index to i32
    %jf = arith.sitofp %ji : i32 to f32
    %w = math.sin %jf : f32
    %c = math.cos %jf : f32
    %f = math.floor %s : f32
    %n = math.absf %s : f32
    %e = math.ceil %n : f32
    %one = arith.constant 1.0 : f32
    %e1 = arith.addf %e, %one : f32
    %r = math.rsqrt %e1 : f32
    %q = math.sqrt %e1 : f32
    %a = arith.addf %w, %c : f32
    %a2 = arith.addf %a, %f : f32
    %a3 = arith.addf %a2, %r : f32
    %mx = arith.maximumf %n, %q : f32
    %mn = arith.minimumf %mx, %a3 : f32
    %y = arith.addf %s, %mn : f32
    attn.yield %y : f32
}
