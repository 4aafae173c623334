{
^bb0(%b: index, %h: index, %i: index, %j: index):
  %c3 = arith.constant 3 : index
  %a = arith.remui %i, %c3 : index
  %c = arith.remui %j, %c3 : index
  %same = arith.cmpi eq, %a, %c : index
  %le = arith.cmpi sle, %j, %i : index
  %keep = arith.andi %same, %le : i1
  attn.yield %keep : i1
}
