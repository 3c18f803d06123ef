// RUN: day0-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(materialize-to-barrier)' | filecheck %s

// A column slice made a tensor of its own: to builtin, the barrier, back to torch; the users
// read the barrier's result.
// CHECK-LABEL: func.func @slice
// CHECK:       %[[B:.*]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[16,80],f32> -> tensor<16x80xf32>
// CHECK:       %[[O:.*]] = util.optimization_barrier %[[B]] : tensor<16x80xf32>
// CHECK:       %[[T:.*]] = torch_c.from_builtin_tensor %[[O]] : tensor<16x80xf32> -> !torch.vtensor<[16,80],f32>
// CHECK:       return %[[T]]
// CHECK-NOT:   torch.day0.materialize
func.func @slice(%x: !torch.vtensor<[16,80],f32>) -> !torch.vtensor<[16,80],f32> {
  %0 = torch.operator "torch.day0.materialize"(%x) : (!torch.vtensor<[16,80],f32>) -> !torch.vtensor<[16,80],f32>
  return %0 : !torch.vtensor<[16,80],f32>
}

// -----

// Dynamic dims and integer tensors.
// CHECK-LABEL: func.func @dynamic
// CHECK:       torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[?,4],si64> -> tensor<?x4xi64>
// CHECK:       util.optimization_barrier %{{.*}} : tensor<?x4xi64>
func.func @dynamic(%x: !torch.vtensor<[?,4],si64>) -> !torch.vtensor<[?,4],si64> {
  %0 = torch.operator "torch.day0.materialize"(%x) : (!torch.vtensor<[?,4],si64>) -> !torch.vtensor<[?,4],si64>
  return %0 : !torch.vtensor<[?,4],si64>
}

// -----

func.func @bad_type(%x: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],si64> {
  // expected-error @+1 {{torch.day0.materialize takes one tensor and returns a tensor of its type}}
  %0 = torch.operator "torch.day0.materialize"(%x) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],si64>
  return %0 : !torch.vtensor<[4],si64>
}
