// RUN: day0-opt %s --pass-pipeline='builtin.module(parameters-to-globals)' | filecheck %s
// RUN: day0-opt %s --pass-pipeline='builtin.module(parameters-to-globals{scope=weights})' | filecheck %s --check-prefix=SCOPE

// One global per distinct key, first-use order, ahead of the functions; ui8 is i8 in builtin tensors.
// CHECK-LABEL: module {
// CHECK-NEXT:    util.global private @model.layers.0.mlp.gate_proj.weight = #flow.parameter.named<"model"::"model.layers.0.mlp.gate_proj.weight"> : tensor<64x32xf32>
// CHECK-NEXT:    util.global private @model.layers.0.mlp.gate_proj.bias = #flow.parameter.named<"model"::"model.layers.0.mlp.gate_proj.bias"> : tensor<64xf32>
// CHECK-NEXT:    util.global private @prefill_1 = #flow.parameter.named<"model"::"prefill"> : tensor<64xf32>
// CHECK-NEXT:    util.global private @_0.experts.blocks_packed = #flow.parameter.named<"model"::"0.experts.blocks-packed"> : tensor<8x16xi8>
// CHECK-NEXT:    func.func @prefill(
// SCOPE: util.global private @model.layers.0.mlp.gate_proj.weight = #flow.parameter.named<"weights"::"model.layers.0.mlp.gate_proj.weight"> : tensor<64x32xf32>
// SCOPE-NOT: "model"::

// Each use loads the global and converts it back to the torch type.
// CHECK-NEXT:      [[W:%.+]] = util.global.load @model.layers.0.mlp.gate_proj.weight : tensor<64x32xf32>
// CHECK-NEXT:      [[WT:%.+]] = torch_c.from_builtin_tensor [[W]] : tensor<64x32xf32> -> !torch.vtensor<[64,32],f32>
// CHECK-NEXT:      [[B:%.+]] = util.global.load @model.layers.0.mlp.gate_proj.bias : tensor<64xf32>
// CHECK-NEXT:      [[BT:%.+]] = torch_c.from_builtin_tensor [[B]] : tensor<64xf32> -> !torch.vtensor<[64],f32>
// CHECK-NEXT:      [[P:%.+]] = util.global.load @prefill_1 : tensor<64xf32>
// CHECK-NEXT:      [[PT:%.+]] = torch_c.from_builtin_tensor [[P]] : tensor<64xf32> -> !torch.vtensor<[64],f32>
// CHECK-NEXT:      [[Y:%.+]] = torch.aten.linear %arg0, [[WT]], [[BT]]
// CHECK-NEXT:      %int1 = torch.constant.int 1
// CHECK-NEXT:      torch.aten.add.Tensor [[Y]], [[PT]], %int1
func.func @prefill(%x: !torch.vtensor<[2,32],f32>) -> !torch.vtensor<[2,64],f32> {
  %w = torch.operator "torch.day0.parameter"() {day0.key = "model.layers.0.mlp.gate_proj.weight"} : () -> !torch.vtensor<[64,32],f32>
  %b = torch.operator "torch.day0.parameter"() {day0.key = "model.layers.0.mlp.gate_proj.bias"} : () -> !torch.vtensor<[64],f32>
  %p = torch.operator "torch.day0.parameter"() {day0.key = "prefill"} : () -> !torch.vtensor<[64],f32>
  %y = torch.aten.linear %x, %w, %b : !torch.vtensor<[2,32],f32>, !torch.vtensor<[64,32],f32>, !torch.vtensor<[64],f32> -> !torch.vtensor<[2,64],f32>
  %int1 = torch.constant.int 1
  %z = torch.aten.add.Tensor %y, %p, %int1 : !torch.vtensor<[2,64],f32>, !torch.vtensor<[64],f32>, !torch.int -> !torch.vtensor<[2,64],f32>
  return %z : !torch.vtensor<[2,64],f32>
}

// The same key in another function reuses its global; keys become legal symbols.
// CHECK-LABEL: func.func @decode(
// CHECK-NEXT:      [[W2:%.+]] = util.global.load @model.layers.0.mlp.gate_proj.weight : tensor<64x32xf32>
// CHECK-NEXT:      torch_c.from_builtin_tensor [[W2]] : tensor<64x32xf32> -> !torch.vtensor<[64,32],f32>
// CHECK-NEXT:      [[E:%.+]] = util.global.load @_0.experts.blocks_packed : tensor<8x16xi8>
// CHECK-NEXT:      torch_c.from_builtin_tensor [[E]] : tensor<8x16xi8> -> !torch.vtensor<[8,16],ui8>
// CHECK-NOT:       torch.day0.parameter
func.func @decode(%x: !torch.vtensor<[1,32],f32>) -> (!torch.vtensor<[1,64],f32>, !torch.vtensor<[8,16],ui8>) {
  %w = torch.operator "torch.day0.parameter"() {day0.key = "model.layers.0.mlp.gate_proj.weight"} : () -> !torch.vtensor<[64,32],f32>
  %e = torch.operator "torch.day0.parameter"() {day0.key = "0.experts.blocks-packed"} : () -> !torch.vtensor<[8,16],ui8>
  %none = torch.constant.none
  %y = torch.aten.linear %x, %w, %none : !torch.vtensor<[1,32],f32>, !torch.vtensor<[64,32],f32>, !torch.none -> !torch.vtensor<[1,64],f32>
  return %y, %e : !torch.vtensor<[1,64],f32>, !torch.vtensor<[8,16],ui8>
}
