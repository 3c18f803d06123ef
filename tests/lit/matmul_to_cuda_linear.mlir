// RUN: day0-opt %s --pass-pipeline='builtin.module(matmul-to-cuda-linear)' | filecheck %s
// RUN: day0-opt %s --pass-pipeline='builtin.module(matmul-to-cuda-linear{min-rows=1})' | filecheck %s --check-prefix=ONE

// A batched decode step's linear against a bf16 weight (export's form: widen, permute, mm): one
// call of a function holding one flow.dispatch of the linear kernel on x and the bf16 weight
// itself. The widen and the permute are gone. 64 rows × 2048 of K over 2048 columns: 32 column
// tiles, a cluster of 8 CTAs along K (kernel_geometry.linear_cluster).
func.func @linear(%x: !torch.vtensor<[64,2048],f32>, %w: !torch.vtensor<[2048,2048],bf16>) -> !torch.vtensor<[64,2048],f32> {
  %int6 = torch.constant.int 6
  %int1 = torch.constant.int 1
  %int0 = torch.constant.int 0
  %wf = torch.prims.convert_element_type %w, %int6 : !torch.vtensor<[2048,2048],bf16>, !torch.int -> !torch.vtensor<[2048,2048],f32>
  %perm = torch.prim.ListConstruct %int1, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %wt = torch.aten.permute %wf, %perm : !torch.vtensor<[2048,2048],f32>, !torch.list<int> -> !torch.vtensor<[2048,2048],f32>
  %y = torch.aten.mm %x, %wt : !torch.vtensor<[64,2048],f32>, !torch.vtensor<[2048,2048],f32> -> !torch.vtensor<[64,2048],f32>
  return %y : !torch.vtensor<[64,2048],f32>
}
// CHECK-LABEL: func.func @linear(
// CHECK-NOT:     torch.prims.convert_element_type
// CHECK-NOT:     torch.aten.permute
// CHECK:         [[X:%.+]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[64,2048],f32> -> tensor<64x2048xf32>
// CHECK-NEXT:    [[W:%.+]] = torch_c.to_builtin_tensor %arg1 : !torch.vtensor<[2048,2048],bf16> -> tensor<2048x2048xbf16>
// CHECK-NEXT:    [[Y:%.+]] = call @day0_linear_bf16_64x2048x2048([[X]], [[W]]) : (tensor<64x2048xf32>, tensor<2048x2048xbf16>) -> tensor<64x2048xf32>
// CHECK-NEXT:    [[R:%.+]] = torch_c.from_builtin_tensor [[Y]] : tensor<64x2048xf32> -> !torch.vtensor<[64,2048],f32>
// CHECK-NEXT:    return [[R]]

// The transpose on the bf16 value, before the widen (aten.t): the same call, one function per
// shape; 4 rows over 18432 columns: 288 column tiles, no cluster.
func.func @t_first(%x: !torch.vtensor<[4,256],f32>, %w: !torch.vtensor<[18432,256],bf16>) -> !torch.vtensor<[4,18432],f32> {
  %int6 = torch.constant.int 6
  %wt = torch.aten.t %w : !torch.vtensor<[18432,256],bf16> -> !torch.vtensor<[256,18432],bf16>
  %wf = torch.prims.convert_element_type %wt, %int6 : !torch.vtensor<[256,18432],bf16>, !torch.int -> !torch.vtensor<[256,18432],f32>
  %y = torch.aten.mm %x, %wf : !torch.vtensor<[4,256],f32>, !torch.vtensor<[256,18432],f32> -> !torch.vtensor<[4,18432],f32>
  return %y : !torch.vtensor<[4,18432],f32>
}
// CHECK-LABEL: func.func @t_first(
// CHECK-NOT:     torch.aten.t
// CHECK:         call @day0_linear_bf16_4x18432x256({{%.+}}, {{%.+}}) : (tensor<4x256xf32>, tensor<18432x256xbf16>) -> tensor<4x18432xf32>

// Left alone: one row (min-rows=2 by default), more than 64 rows, K not a multiple of 8, an f32
// weight, a weight that is not transposed (x · w with w stored [K, N]).
func.func @kept(%x1: !torch.vtensor<[1,64],f32>, %x65: !torch.vtensor<[65,64],f32>, %x12: !torch.vtensor<[4,12],f32>,
                %w: !torch.vtensor<[32,64],bf16>, %w12: !torch.vtensor<[32,12],bf16>, %wf32: !torch.vtensor<[64,32],f32>,
                %wkn: !torch.vtensor<[64,32],bf16>, %x4: !torch.vtensor<[4,64],f32>)
    -> (!torch.vtensor<[1,32],f32>, !torch.vtensor<[65,32],f32>, !torch.vtensor<[4,32],f32>, !torch.vtensor<[4,32],f32>, !torch.vtensor<[4,32],f32>) {
  %int6 = torch.constant.int 6
  %wf = torch.prims.convert_element_type %w, %int6 : !torch.vtensor<[32,64],bf16>, !torch.int -> !torch.vtensor<[32,64],f32>
  %wt = torch.aten.t %wf : !torch.vtensor<[32,64],f32> -> !torch.vtensor<[64,32],f32>
  %y1 = torch.aten.mm %x1, %wt : !torch.vtensor<[1,64],f32>, !torch.vtensor<[64,32],f32> -> !torch.vtensor<[1,32],f32>
  %y65 = torch.aten.mm %x65, %wt : !torch.vtensor<[65,64],f32>, !torch.vtensor<[64,32],f32> -> !torch.vtensor<[65,32],f32>
  %w12f = torch.prims.convert_element_type %w12, %int6 : !torch.vtensor<[32,12],bf16>, !torch.int -> !torch.vtensor<[32,12],f32>
  %w12t = torch.aten.t %w12f : !torch.vtensor<[32,12],f32> -> !torch.vtensor<[12,32],f32>
  %y12 = torch.aten.mm %x12, %w12t : !torch.vtensor<[4,12],f32>, !torch.vtensor<[12,32],f32> -> !torch.vtensor<[4,32],f32>
  %yf = torch.aten.mm %x4, %wf32 : !torch.vtensor<[4,64],f32>, !torch.vtensor<[64,32],f32> -> !torch.vtensor<[4,32],f32>
  %wknf = torch.prims.convert_element_type %wkn, %int6 : !torch.vtensor<[64,32],bf16>, !torch.int -> !torch.vtensor<[64,32],f32>
  %ykn = torch.aten.mm %x4, %wknf : !torch.vtensor<[4,64],f32>, !torch.vtensor<[64,32],f32> -> !torch.vtensor<[4,32],f32>
  return %y1, %y65, %y12, %yf, %ykn : !torch.vtensor<[1,32],f32>, !torch.vtensor<[65,32],f32>, !torch.vtensor<[4,32],f32>, !torch.vtensor<[4,32],f32>, !torch.vtensor<[4,32],f32>
}
// CHECK-LABEL: func.func @kept(
// CHECK-COUNT-5: torch.aten.mm
// CHECK-NOT:     call @day0_linear
// ONE-LABEL:   func.func @kept(
// ONE:           call @day0_linear_bf16_1x32x64(
// ONE-COUNT-4:   torch.aten.mm

// The functions (sorted by name), and the kernels' executable with its four cluster sizes.
// CHECK:       hal.executable.source private @day0_linear_bf16 <objects = <{#executable_target_cuda_nvptx_fb = [#hal.executable.object<{path = "linear_bf16.sm_90.ptx", data = dense<"0x{{[0-9A-F]+}}">
// CHECK:       hal.executable.export public @day0_linear_bf16_c1 ordinal(0)
// CHECK:       hal.executable.export public @day0_linear_bf16_c2 ordinal(1)
// CHECK:       hal.executable.export public @day0_linear_bf16_c4 ordinal(2)
// CHECK:       hal.executable.export public @day0_linear_bf16_c8 ordinal(3)
// CHECK-LABEL: func.func private @day0_linear_bf16_4x18432x256(
// CHECK:         %[[GX:.+]] = arith.constant 288 : index
// CHECK-NEXT:    %[[GY:.+]] = arith.constant 1 : index
// CHECK:         flow.dispatch @day0_linear_bf16::@day0_linear_bf16_c1[%[[GX]], %[[GY]]]
// CHECK-LABEL: func.func private @day0_linear_bf16_64x2048x2048(
// CHECK:         %[[GX:.+]] = arith.constant 32 : index
// CHECK-NEXT:    %[[GY:.+]] = arith.constant 8 : index
// CHECK-NEXT:    %[[M:.+]] = arith.constant 64 : i32
// CHECK-NEXT:    %[[N:.+]] = arith.constant 2048 : i32
// CHECK-NEXT:    %[[K:.+]] = arith.constant 2048 : i32
// CHECK-NEXT:    flow.dispatch @day0_linear_bf16::@day0_linear_bf16_c8[%[[GX]], %[[GY]]](%[[M]], %[[N]], %[[K]], %arg0, %arg1) : (i32, i32, i32, tensor<64x2048xf32>, tensor<2048x2048xbf16>) -> tensor<64x2048xf32>
