// RUN: day0-opt %s --pass-pipeline='builtin.module(matmul-to-bf16-terms{terms=2 image-terms=1 stack-rows=0})' | filecheck %s
// RUN: day0-opt %s --pass-pipeline='builtin.module(matmul-to-bf16-terms{terms=2 stack-rows=0})' | filecheck %s --check-prefix=SAME

// image-terms: the vision tower's functions (encode_image_<P>) split x into their own number of
// terms, every other function into `terms`; 0 (the default) means `terms` everywhere.
func.func @encode_image_64(%x: !torch.vtensor<[64,32],f32>, %w: !torch.vtensor<[32,96],bf16>) -> !torch.vtensor<[64,96],f32> {
  %int6 = torch.constant.int 6
  %wf = torch.prims.convert_element_type %w, %int6 : !torch.vtensor<[32,96],bf16>, !torch.int -> !torch.vtensor<[32,96],f32>
  %y = torch.aten.mm %x, %wf : !torch.vtensor<[64,32],f32>, !torch.vtensor<[32,96],f32> -> !torch.vtensor<[64,96],f32>
  return %y : !torch.vtensor<[64,96],f32>
}
// One term: x rounded to bf16, one bf16 matmul.
// CHECK-LABEL: func.func @encode_image_64(
// CHECK-COUNT-1: linalg.matmul
// CHECK-NOT:     linalg.matmul
// CHECK:         return
// SAME-LABEL:  func.func @encode_image_64(
// SAME-COUNT-2:  linalg.matmul
// SAME-NOT:      linalg.matmul
// SAME:          return

func.func @prefill(%x: !torch.vtensor<[64,32],f32>, %w: !torch.vtensor<[32,96],bf16>) -> !torch.vtensor<[64,96],f32> {
  %int6 = torch.constant.int 6
  %wf = torch.prims.convert_element_type %w, %int6 : !torch.vtensor<[32,96],bf16>, !torch.int -> !torch.vtensor<[32,96],f32>
  %y = torch.aten.mm %x, %wf : !torch.vtensor<[64,32],f32>, !torch.vtensor<[32,96],f32> -> !torch.vtensor<[64,96],f32>
  return %y : !torch.vtensor<[64,96],f32>
}
// CHECK-LABEL: func.func @prefill(
// CHECK-COUNT-2: linalg.matmul
// CHECK-NOT:     linalg.matmul
// CHECK:         return
