{
^bb0(%b: index, %h: index, %i: index, %j: index):
  %c50 = arith.constant 50 : index
  %reach = arith.muli %h, %c50 : index
  %top = arith.addi %i, %reach : index
  %keep = arith.cmpi sle, %j, %top : index
  attn.yield %keep : i1
}
