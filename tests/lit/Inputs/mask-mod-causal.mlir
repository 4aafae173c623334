{
^bb0(%b: index, %h: index, %i: index, %j: index):
  %le = arith.cmpi sle, %j, %i : index
  attn.yield %le : i1
}
