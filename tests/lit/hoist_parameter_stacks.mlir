// RUN: day0-opt %s --pass-pipeline='builtin.module(hoist-parameter-stacks)' | filecheck %s
// RUN: day0-opt %s --pass-pipeline='builtin.module(hoist-parameter-stacks{min-operands=1})' | filecheck %s --check-prefix=ONE

// One global per distinct stack, after the parameters, each stored by its own initializer:
// every parameter goes straight to its place (cat: offset along the dim; stack: index i).
// CHECK:        util.global private @norm =
// CHECK-NEXT:   util.global private @e.all.gate_up : tensor<2x4x3xi8>
// CHECK-NEXT:   util.initializer {
// CHECK-NEXT:     [[E:%.+]] = tensor.empty() : tensor<2x4x3xi8>
// CHECK-NEXT:     [[G0:%.+]] = util.global.load @e.0.gate : tensor<2x3xi8>
// CHECK-NEXT:     [[S0:%.+]] = tensor.insert_slice [[G0]] into [[E]][0, 0, 0] [1, 2, 3] [1, 1, 1] : tensor<2x3xi8> into tensor<2x4x3xi8>
// CHECK-NEXT:     [[U0:%.+]] = util.global.load @e.0.up : tensor<2x3xi8>
// CHECK-NEXT:     [[S1:%.+]] = tensor.insert_slice [[U0]] into [[S0]][0, 2, 0] [1, 2, 3] [1, 1, 1] : tensor<2x3xi8> into tensor<2x4x3xi8>
// CHECK-NEXT:     [[G1:%.+]] = util.global.load @e.1.gate : tensor<2x3xi8>
// CHECK-NEXT:     [[S2:%.+]] = tensor.insert_slice [[G1]] into [[S1]][1, 0, 0] [1, 2, 3] [1, 1, 1] : tensor<2x3xi8> into tensor<2x4x3xi8>
// CHECK-NEXT:     [[U1:%.+]] = util.global.load @e.1.up : tensor<2x3xi8>
// CHECK-NEXT:     [[S3:%.+]] = tensor.insert_slice [[U1]] into [[S2]][1, 2, 0] [1, 2, 3] [1, 1, 1] : tensor<2x3xi8> into tensor<2x4x3xi8>
// CHECK-NEXT:     util.global.store [[S3]], @e.all.gate_up : tensor<2x4x3xi8>
// CHECK-NEXT:     util.return
// CHECK-NEXT:   }
// The global holds the stack without its final view (so views of it share it).
// CHECK-NEXT:   util.global private @e.all.down : tensor<6x2xf32>
// CHECK-NEXT:   util.initializer {
// CHECK-NEXT:     [[E:%.+]] = tensor.empty() : tensor<6x2xf32>
// CHECK-NEXT:     [[D0:%.+]] = util.global.load @e.0.down : tensor<3x2xf32>
// CHECK-NEXT:     [[S0:%.+]] = tensor.insert_slice [[D0]] into [[E]][0, 0] [3, 2] [1, 1] : tensor<3x2xf32> into tensor<6x2xf32>
// CHECK-NEXT:     [[D1:%.+]] = util.global.load @e.1.down : tensor<3x2xf32>
// CHECK-NEXT:     [[S1:%.+]] = tensor.insert_slice [[D1]] into [[S0]][3, 0] [3, 2] [1, 1] : tensor<3x2xf32> into tensor<6x2xf32>
// CHECK-NEXT:     util.global.store [[S1]], @e.all.down : tensor<6x2xf32>
// CHECK-NEXT:     util.return
// CHECK-NEXT:   }
// CHECK-NOT:    util.global
// CHECK-NOT:    util.initializer

// Each stack becomes a load of its global (a view: reshaped on builtin tensors, collapse to
// 1-D then expand); the stack's ops, lists and dead constants are gone.
// CHECK-LABEL: func.func @prefill(
// CHECK-NEXT:     [[GU:%.+]] = util.global.load @e.all.gate_up : tensor<2x4x3xi8>
// CHECK-NEXT:     [[GUT:%.+]] = torch_c.from_builtin_tensor [[GU]] : tensor<2x4x3xi8> -> !torch.vtensor<[2,4,3],ui8>
// CHECK-NEXT:     [[D:%.+]] = util.global.load @e.all.down : tensor<6x2xf32>
// CHECK-NEXT:     [[F:%.+]] = tensor.collapse_shape [[D]] {{\[}}[0, 1]] : tensor<6x2xf32> into tensor<12xf32>
// CHECK-NEXT:     [[R:%.+]] = tensor.expand_shape [[F]] {{\[}}[0, 1, 2]] output_shape [2, 3, 2] : tensor<12xf32> into tensor<2x3x2xf32>
// CHECK-NEXT:     [[DT:%.+]] = torch_c.from_builtin_tensor [[R]] : tensor<2x3x2xf32> -> !torch.vtensor<[2,3,2],f32>
// CHECK-NEXT:     return [[GUT]], [[DT]]

util.global private @e.0.gate = #flow.parameter.named<"model"::"e.0.gate"> : tensor<2x3xi8>
util.global private @e.0.up = #flow.parameter.named<"model"::"e.0.up"> : tensor<2x3xi8>
util.global private @e.1.gate = #flow.parameter.named<"model"::"e.1.gate"> : tensor<2x3xi8>
util.global private @e.1.up = #flow.parameter.named<"model"::"e.1.up"> : tensor<2x3xi8>
util.global private @e.0.down = #flow.parameter.named<"model"::"e.0.down"> : tensor<3x2xf32>
util.global private @e.1.down = #flow.parameter.named<"model"::"e.1.down"> : tensor<3x2xf32>
util.global private @norm = #flow.parameter.named<"model"::"norm"> : tensor<6xf32>

// stack(cat(gate_e, up_e) for e), and stack(down_e) as torch.export decomposes it: cat + view.
func.func @prefill() -> (!torch.vtensor<[2,4,3],ui8>, !torch.vtensor<[2,3,2],f32>) {
  %0 = util.global.load @e.0.gate : tensor<2x3xi8>
  %g0 = torch_c.from_builtin_tensor %0 : tensor<2x3xi8> -> !torch.vtensor<[2,3],ui8>
  %1 = util.global.load @e.0.up : tensor<2x3xi8>
  %u0 = torch_c.from_builtin_tensor %1 : tensor<2x3xi8> -> !torch.vtensor<[2,3],ui8>
  %2 = util.global.load @e.1.gate : tensor<2x3xi8>
  %g1 = torch_c.from_builtin_tensor %2 : tensor<2x3xi8> -> !torch.vtensor<[2,3],ui8>
  %3 = util.global.load @e.1.up : tensor<2x3xi8>
  %u1 = torch_c.from_builtin_tensor %3 : tensor<2x3xi8> -> !torch.vtensor<[2,3],ui8>
  %int0 = torch.constant.int 0
  %l0 = torch.prim.ListConstruct %g0, %u0 : (!torch.vtensor<[2,3],ui8>, !torch.vtensor<[2,3],ui8>) -> !torch.list<vtensor>
  %c0 = torch.aten.cat %l0, %int0 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[4,3],ui8>
  %l1 = torch.prim.ListConstruct %g1, %u1 : (!torch.vtensor<[2,3],ui8>, !torch.vtensor<[2,3],ui8>) -> !torch.list<vtensor>
  %c1 = torch.aten.cat %l1, %int0 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[4,3],ui8>
  %l = torch.prim.ListConstruct %c0, %c1 : (!torch.vtensor<[4,3],ui8>, !torch.vtensor<[4,3],ui8>) -> !torch.list<vtensor>
  %s = torch.aten.stack %l, %int0 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[2,4,3],ui8>
  %4 = util.global.load @e.0.down : tensor<3x2xf32>
  %d0 = torch_c.from_builtin_tensor %4 : tensor<3x2xf32> -> !torch.vtensor<[3,2],f32>
  %5 = util.global.load @e.1.down : tensor<3x2xf32>
  %d1 = torch_c.from_builtin_tensor %5 : tensor<3x2xf32> -> !torch.vtensor<[3,2],f32>
  %ld = torch.prim.ListConstruct %d0, %d1 : (!torch.vtensor<[3,2],f32>, !torch.vtensor<[3,2],f32>) -> !torch.list<vtensor>
  %cd = torch.aten.cat %ld, %int0 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[6,2],f32>
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %shape = torch.prim.ListConstruct %int2, %int3, %int2 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %v = torch.aten.view %cd, %shape : !torch.vtensor<[6,2],f32>, !torch.list<int> -> !torch.vtensor<[2,3,2],f32>
  return %s, %v : !torch.vtensor<[2,4,3],ui8>, !torch.vtensor<[2,3,2],f32>
}

// The same stacks in another function (dim -3 is dim 0; down without its view) load the same
// globals (e.0.down, also read by a kept stack, stays). Untouched: a stack that reads a non-parameter value, a reshaped parameter, and a
// stack of one parameter (below min-operands).
// CHECK-LABEL: func.func @decode(
// CHECK-NEXT:     %int0 = torch.constant.int 0
// CHECK-NEXT:     [[GU:%.+]] = util.global.load @e.all.gate_up : tensor<2x4x3xi8>
// CHECK-NEXT:     [[GUT:%.+]] = torch_c.from_builtin_tensor [[GU]] : tensor<2x4x3xi8> -> !torch.vtensor<[2,4,3],ui8>
// CHECK-NEXT:     [[D0:%.+]] = util.global.load @e.0.down : tensor<3x2xf32>
// CHECK-NEXT:     [[D0T:%.+]] = torch_c.from_builtin_tensor [[D0]]
// CHECK-NEXT:     [[D:%.+]] = util.global.load @e.all.down : tensor<6x2xf32>
// CHECK-NEXT:     [[DT:%.+]] = torch_c.from_builtin_tensor [[D]] : tensor<6x2xf32> -> !torch.vtensor<[6,2],f32>
// CHECK-NEXT:     [[L:%.+]] = torch.prim.ListConstruct [[D0T]], %arg0
// CHECK-NEXT:     [[SX:%.+]] = torch.aten.stack [[L]], %int0
// CHECK-NEXT:     [[N:%.+]] = util.global.load @norm : tensor<6xf32>
// CHECK-NEXT:     [[NT:%.+]] = torch_c.from_builtin_tensor [[N]]
// CHECK-NEXT:     [[UN:%.+]] = torch.aten.unsqueeze [[NT]], %int0
// CHECK-NEXT:     [[LN:%.+]] = torch.prim.ListConstruct [[NT]]
// CHECK-NEXT:     [[SN:%.+]] = torch.aten.stack [[LN]], %int0
// CHECK-NEXT:     return [[GUT]], [[DT]], [[SX]], [[UN]], [[SN]]

// With min-operands=1 the one-parameter stack gets its global too; the reshaped parameter
// still does not (there is nothing to compute).
// ONE:          util.global private @norm_1 : tensor<1x6xf32>
// ONE-NEXT:     util.initializer {
// ONE-NEXT:       [[E:%.+]] = tensor.empty() : tensor<1x6xf32>
// ONE-NEXT:       [[N:%.+]] = util.global.load @norm : tensor<6xf32>
// ONE-NEXT:       [[S:%.+]] = tensor.insert_slice [[N]] into [[E]][0, 0] [1, 6] [1, 1] : tensor<6xf32> into tensor<1x6xf32>
// ONE-NEXT:       util.global.store [[S]], @norm_1 : tensor<1x6xf32>
// ONE-LABEL:    func.func @decode(
// ONE:            [[UN:%.+]] = torch.aten.unsqueeze
// ONE-NEXT:       [[N1:%.+]] = util.global.load @norm_1 : tensor<1x6xf32>
// ONE-NEXT:       [[N1T:%.+]] = torch_c.from_builtin_tensor [[N1]] : tensor<1x6xf32> -> !torch.vtensor<[1,6],f32>
// ONE-NEXT:       return {{.*}}, [[UN]], [[N1T]]
func.func @decode(%x: !torch.vtensor<[3,2],f32>) -> (!torch.vtensor<[2,4,3],ui8>, !torch.vtensor<[6,2],f32>, !torch.vtensor<[2,3,2],f32>, !torch.vtensor<[1,6],f32>, !torch.vtensor<[1,6],f32>) {
  %int0 = torch.constant.int 0
  %int-3 = torch.constant.int -3
  %0 = util.global.load @e.0.gate : tensor<2x3xi8>
  %g0 = torch_c.from_builtin_tensor %0 : tensor<2x3xi8> -> !torch.vtensor<[2,3],ui8>
  %1 = util.global.load @e.0.up : tensor<2x3xi8>
  %u0 = torch_c.from_builtin_tensor %1 : tensor<2x3xi8> -> !torch.vtensor<[2,3],ui8>
  %l0 = torch.prim.ListConstruct %g0, %u0 : (!torch.vtensor<[2,3],ui8>, !torch.vtensor<[2,3],ui8>) -> !torch.list<vtensor>
  %c0 = torch.aten.cat %l0, %int0 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[4,3],ui8>
  %2 = util.global.load @e.1.gate : tensor<2x3xi8>
  %g1 = torch_c.from_builtin_tensor %2 : tensor<2x3xi8> -> !torch.vtensor<[2,3],ui8>
  %3 = util.global.load @e.1.up : tensor<2x3xi8>
  %u1 = torch_c.from_builtin_tensor %3 : tensor<2x3xi8> -> !torch.vtensor<[2,3],ui8>
  %l1 = torch.prim.ListConstruct %g1, %u1 : (!torch.vtensor<[2,3],ui8>, !torch.vtensor<[2,3],ui8>) -> !torch.list<vtensor>
  %c1 = torch.aten.cat %l1, %int0 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[4,3],ui8>
  %l = torch.prim.ListConstruct %c0, %c1 : (!torch.vtensor<[4,3],ui8>, !torch.vtensor<[4,3],ui8>) -> !torch.list<vtensor>
  %s = torch.aten.stack %l, %int-3 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[2,4,3],ui8>
  %4 = util.global.load @e.0.down : tensor<3x2xf32>
  %d0 = torch_c.from_builtin_tensor %4 : tensor<3x2xf32> -> !torch.vtensor<[3,2],f32>
  %5 = util.global.load @e.1.down : tensor<3x2xf32>
  %d1 = torch_c.from_builtin_tensor %5 : tensor<3x2xf32> -> !torch.vtensor<[3,2],f32>
  %ld = torch.prim.ListConstruct %d0, %d1 : (!torch.vtensor<[3,2],f32>, !torch.vtensor<[3,2],f32>) -> !torch.list<vtensor>
  %cd = torch.aten.cat %ld, %int0 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[6,2],f32>
  %lx = torch.prim.ListConstruct %d0, %x : (!torch.vtensor<[3,2],f32>, !torch.vtensor<[3,2],f32>) -> !torch.list<vtensor>
  %sx = torch.aten.stack %lx, %int0 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[2,3,2],f32>
  %6 = util.global.load @norm : tensor<6xf32>
  %n = torch_c.from_builtin_tensor %6 : tensor<6xf32> -> !torch.vtensor<[6],f32>
  %un = torch.aten.unsqueeze %n, %int0 : !torch.vtensor<[6],f32>, !torch.int -> !torch.vtensor<[1,6],f32>
  %ln = torch.prim.ListConstruct %n : (!torch.vtensor<[6],f32>) -> !torch.list<vtensor>
  %sn = torch.aten.stack %ln, %int0 : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[1,6],f32>
  return %s, %cd, %sx, %un, %sn : !torch.vtensor<[2,4,3],ui8>, !torch.vtensor<[6,2],f32>, !torch.vtensor<[2,3,2],f32>, !torch.vtensor<[1,6],f32>, !torch.vtensor<[1,6],f32>
}
