// RUN: day0-opt %s --pass-pipeline='builtin.module(fuse-mxfp4-matmul)' | filecheck %s --check-prefixes=CHECK,UNFUSED
// RUN: day0-opt %s --pass-pipeline='builtin.module(fuse-mxfp4-matmul{prefill=unfused})' | filecheck %s --check-prefixes=CHECK,UNFUSED
// RUN: day0-opt %s --pass-pipeline='builtin.module(fuse-mxfp4-matmul{prefill=fused})' | filecheck %s --check-prefixes=CHECK,FUSED

// No custom op survives, whatever the prefill form.
// CHECK-NOT: torch.day0.

// Decode linear (M = 1): x deinterleaved (·0.5) behind a barrier, then ONE contraction over
// (m, n | g, b) that decodes both nibbles of each packed byte and applies 2^(s-127).
func.func @linear_decode(%x: !torch.vtensor<[1,64],f32>, %p: !torch.vtensor<[8,32],ui8>, %s: !torch.vtensor<[8,2],ui8>) -> !torch.vtensor<[1,8],f32> {
  %y = torch.operator "torch.day0.mxfp4_linear"(%x, %p, %s) : (!torch.vtensor<[1,64],f32>, !torch.vtensor<[8,32],ui8>, !torch.vtensor<[8,2],ui8>) -> !torch.vtensor<[1,8],f32>
  return %y : !torch.vtensor<[1,8],f32>
}
// CHECK-LABEL: func.func @linear_decode(
// CHECK-NEXT:  [[X:%.+]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[1,64],f32> -> tensor<1x64xf32>
// CHECK-NEXT:  [[P:%.+]] = torch_c.to_builtin_tensor %arg1 : !torch.vtensor<[8,32],ui8> -> tensor<8x32xi8>
// CHECK-NEXT:  [[S:%.+]] = torch_c.to_builtin_tensor %arg2 : !torch.vtensor<[8,2],ui8> -> tensor<8x2xi8>
// CHECK-NEXT:  [[X3:%.+]] = tensor.expand_shape [[X]] {{\[\[}}0], [1, 2]] output_shape [1, 32, 2] : tensor<1x64xf32> into tensor<1x32x2xf32>
// CHECK-NEXT:  [[XE:%.+]] = tensor.empty() : tensor<1x2x32xf32>
// CHECK-NEXT:  [[XT:%.+]] = linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "parallel"]} ins([[X3]] : tensor<1x32x2xf32>) outs([[XE]] : tensor<1x2x32xf32>) {
// CHECK-NEXT:  ^bb0([[V:%.+]]: f32, {{%.+}}: f32):
// CHECK-NEXT:    [[HALF:%.+]] = arith.constant 5.000000e-01 : f32
// CHECK-NEXT:    [[HV:%.+]] = arith.mulf [[V]], [[HALF]] : f32
// CHECK-NEXT:    linalg.yield [[HV]] : f32
// CHECK-NEXT:  } -> tensor<1x2x32xf32>
// CHECK-NEXT:  [[XB:%.+]] = util.optimization_barrier [[XT]] : tensor<1x2x32xf32>
// CHECK-NEXT:  [[XLO2:%.+]] = tensor.extract_slice [[XB]][0, 0, 0] [1, 1, 32] [1, 1, 1] : tensor<1x2x32xf32> to tensor<1x32xf32>
// CHECK-NEXT:  [[XHI2:%.+]] = tensor.extract_slice [[XB]][0, 1, 0] [1, 1, 32] [1, 1, 1] : tensor<1x2x32xf32> to tensor<1x32xf32>
// CHECK-NEXT:  [[XLO:%.+]] = tensor.expand_shape [[XLO2]] {{\[\[}}0], [1, 2]] output_shape [1, 2, 16] : tensor<1x32xf32> into tensor<1x2x16xf32>
// CHECK-NEXT:  [[XHI:%.+]] = tensor.expand_shape [[XHI2]] {{\[\[}}0], [1, 2]] output_shape [1, 2, 16] : tensor<1x32xf32> into tensor<1x2x16xf32>
// CHECK-NEXT:  [[PK:%.+]] = tensor.expand_shape [[P]] {{\[\[}}0], [1, 2]] output_shape [8, 2, 16] : tensor<8x32xi8> into tensor<8x2x16xi8>
// CHECK-NEXT:  [[OE:%.+]] = tensor.empty() : tensor<1x8xf32>
// CHECK-NEXT:  [[ZERO:%.+]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:  [[ACC:%.+]] = linalg.fill ins([[ZERO]] : f32) outs([[OE]] : tensor<1x8xf32>) -> tensor<1x8xf32>
// CHECK-NEXT:  [[R:%.+]] = linalg.generic {indexing_maps = [#map2, #map2, #map3, #map4, #map5], iterator_types = ["parallel", "parallel", "reduction", "reduction"]} ins([[XLO]], [[XHI]], [[PK]], [[S]] : tensor<1x2x16xf32>, tensor<1x2x16xf32>, tensor<8x2x16xi8>, tensor<8x2xi8>) outs([[ACC]] : tensor<1x8xf32>) {
// CHECK-NEXT:  ^bb0([[XL:%.+]]: f32, [[XH:%.+]]: f32, [[BYTE:%.+]]: i8, [[SC:%.+]]: i8, [[O:%.+]]: f32):
// CHECK-NEXT:    [[C2:%.+]] = arith.constant 2 : i32
// CHECK-NEXT:    [[C4:%.+]] = arith.constant 4 : i32
// CHECK-NEXT:    [[C7:%.+]] = arith.constant 7 : i32
// CHECK-NEXT:    [[C8:%.+]] = arith.constant 8 : i32
// CHECK-NEXT:    [[C15:%.+]] = arith.constant 15 : i32
// CHECK-NEXT:    [[C23:%.+]] = arith.constant 23 : i32
// CHECK-NEXT:    [[C28:%.+]] = arith.constant 28 : i32
// 0xC8643210: 2·|E2M1[c]| = 0,1,2,3,4,6,8,12 as 4-bit fields
// CHECK-NEXT:    [[LUT:%.+]] = arith.constant -932957680 : i32
// CHECK-NEXT:    [[B:%.+]] = arith.extui [[BYTE]] : i8 to i32
// CHECK-NEXT:    [[LO:%.+]] = arith.andi [[B]], [[C15]] : i32
// CHECK-NEXT:    [[HI:%.+]] = arith.shrui [[B]], [[C4]] : i32
// CHECK-NEXT:    [[LC:%.+]] = arith.andi [[LO]], [[C7]] : i32
// CHECK-NEXT:    [[LSH:%.+]] = arith.shli [[LC]], [[C2]] : i32
// CHECK-NEXT:    [[LL:%.+]] = arith.shrui [[LUT]], [[LSH]] : i32
// CHECK-NEXT:    [[LM:%.+]] = arith.andi [[LL]], [[C15]] : i32
// CHECK-NEXT:    [[LF:%.+]] = arith.uitofp [[LM]] : i32 to f32
// CHECK-NEXT:    [[LS0:%.+]] = arith.andi [[LO]], [[C8]] : i32
// CHECK-NEXT:    [[LS:%.+]] = arith.shli [[LS0]], [[C28]] : i32
// CHECK-NEXT:    [[LB:%.+]] = arith.bitcast [[LF]] : f32 to i32
// CHECK-NEXT:    [[LV:%.+]] = arith.ori [[LB]], [[LS]] : i32
// CHECK-NEXT:    [[WL:%.+]] = arith.bitcast [[LV]] : i32 to f32
// CHECK-NEXT:    [[HC:%.+]] = arith.andi [[HI]], [[C7]] : i32
// CHECK:         [[WH:%.+]] = arith.bitcast {{%.+}} : i32 to f32
// CHECK-NEXT:    [[S32:%.+]] = arith.extui [[SC]] : i8 to i32
// CHECK-NEXT:    [[SBITS:%.+]] = arith.shli [[S32]], [[C23]] : i32
// CHECK-NEXT:    [[SCALE:%.+]] = arith.bitcast [[SBITS]] : i32 to f32
// CHECK-NEXT:    [[PL:%.+]] = arith.mulf [[XL]], [[WL]] : f32
// CHECK-NEXT:    [[PH:%.+]] = arith.mulf [[XH]], [[WH]] : f32
// CHECK-NEXT:    [[PP:%.+]] = arith.addf [[PL]], [[PH]] : f32
// CHECK-NEXT:    [[PS:%.+]] = arith.mulf [[PP]], [[SCALE]] : f32
// CHECK-NEXT:    [[SUM:%.+]] = arith.addf [[O]], [[PS]] : f32
// CHECK-NEXT:    linalg.yield [[SUM]] : f32
// CHECK-NEXT:  } -> tensor<1x8xf32>
// CHECK-NEXT:  [[Y:%.+]] = torch_c.from_builtin_tensor [[R]] : tensor<1x8xf32> -> !torch.vtensor<[1,8],f32>
// CHECK-NEXT:  return [[Y]] : !torch.vtensor<[1,8],f32>

// Prefill linear (dynamic M). unfused: dequantize to f32 [N, K] behind a barrier, linalg.matmul.
// fused: the decode form with the row count from tensor.dim (tied again after the barrier).
func.func @linear_prefill(%x: !torch.vtensor<[?,64],f32>, %p: !torch.vtensor<[8,32],ui8>, %s: !torch.vtensor<[8,2],ui8>) -> !torch.vtensor<[?,8],f32> {
  %y = torch.operator "torch.day0.mxfp4_linear"(%x, %p, %s) : (!torch.vtensor<[?,64],f32>, !torch.vtensor<[8,32],ui8>, !torch.vtensor<[8,2],ui8>) -> !torch.vtensor<[?,8],f32>
  return %y : !torch.vtensor<[?,8],f32>
}
// CHECK-LABEL: func.func @linear_prefill(
// CHECK-NEXT:  [[X:%.+]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[?,64],f32> -> tensor<?x64xf32>
// CHECK-NEXT:  [[C0:%.+]] = arith.constant 0 : index
// CHECK-NEXT:  [[M:%.+]] = tensor.dim [[X]], [[C0]] : tensor<?x64xf32>
// CHECK-NEXT:  [[P:%.+]] = torch_c.to_builtin_tensor %arg1
// CHECK-NEXT:  [[S:%.+]] = torch_c.to_builtin_tensor %arg2
// UNFUSED-NEXT: [[PK:%.+]] = tensor.expand_shape [[P]] {{\[\[}}0], [1, 2]] output_shape [8, 2, 16] : tensor<8x32xi8> into tensor<8x2x16xi8>
// UNFUSED-NEXT: [[WE:%.+]] = tensor.empty() : tensor<8x2x16x2xf32>
// UNFUSED-NEXT: [[W4:%.+]] = linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins([[PK]], [[S]] : tensor<8x2x16xi8>, tensor<8x2xi8>) outs([[WE]] : tensor<8x2x16x2xf32>) {
// UNFUSED:      linalg.index 3 : index
// UNFUSED:      } -> tensor<8x2x16x2xf32>
// UNFUSED-NEXT: [[WC:%.+]] = tensor.collapse_shape [[W4]] {{\[\[}}0], [1, 2, 3]] : tensor<8x2x16x2xf32> into tensor<8x64xf32>
// UNFUSED-NEXT: [[WT:%.+]] = util.optimization_barrier [[WC]] : tensor<8x64xf32>
// UNFUSED-NEXT: [[OE:%.+]] = tensor.empty([[M]]) : tensor<?x8xf32>
// UNFUSED-NEXT: [[ZERO:%.+]] = arith.constant 0.000000e+00 : f32
// UNFUSED-NEXT: [[ACC:%.+]] = linalg.fill ins([[ZERO]] : f32) outs([[OE]] : tensor<?x8xf32>) -> tensor<?x8xf32>
// UNFUSED-NEXT: [[R:%.+]] = linalg.matmul indexing_maps = [#map{{[0-9]*}}, #map{{[0-9]*}}, #map{{[0-9]*}}] ins([[X]], [[WT]] : tensor<?x64xf32>, tensor<8x64xf32>) outs([[ACC]] : tensor<?x8xf32>) -> tensor<?x8xf32>
// UNFUSED-NEXT: [[Y:%.+]] = torch_c.from_builtin_tensor [[R]] : tensor<?x8xf32> -> !torch.vtensor<[?,8],f32>
// FUSED-NEXT:   [[X3:%.+]] = tensor.expand_shape [[X]] {{\[\[}}0], [1, 2]] output_shape [[[M]], 32, 2] : tensor<?x64xf32> into tensor<?x32x2xf32>
// FUSED-NEXT:   [[XE:%.+]] = tensor.empty([[M]]) : tensor<?x2x32xf32>
// FUSED-NEXT:   [[XT:%.+]] = linalg.generic
// FUSED:        } -> tensor<?x2x32xf32>
// FUSED-NEXT:   [[XB0:%.+]] = util.optimization_barrier [[XT]] : tensor<?x2x32xf32>
// FUSED-NEXT:   [[XB:%.+]] = flow.tensor.tie_shape [[XB0]] : tensor<?x2x32xf32>{[[M]]}
// FUSED-NEXT:   tensor.extract_slice [[XB]][0, 0, 0] [[[M]], 1, 32] [1, 1, 1] : tensor<?x2x32xf32> to tensor<?x32xf32>
// FUSED:        [[R:%.+]] = linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction", "reduction"]} ins({{.*}} : tensor<?x2x16xf32>, tensor<?x2x16xf32>, tensor<8x2x16xi8>, tensor<8x2xi8>) outs({{.*}} : tensor<?x8xf32>) {
// FUSED:        } -> tensor<?x8xf32>
// FUSED-NEXT:   [[Y:%.+]] = torch_c.from_builtin_tensor [[R]] : tensor<?x8xf32> -> !torch.vtensor<[?,8],f32>
// CHECK-NEXT:  return [[Y]] : !torch.vtensor<[?,8],f32>

// Decode moe (T = 1, k = 2 of E = 4): index_select of the chosen experts' bytes and scales
// (u8, packed size), then ONE contraction over (t, j, n | g, b) — the same in both forms.
func.func @moe_decode(%x: !torch.vtensor<[1,64],f32>, %p: !torch.vtensor<[4,8,32],ui8>, %s: !torch.vtensor<[4,8,2],ui8>, %e: !torch.vtensor<[1,2],si64>) -> !torch.vtensor<[1,2,8],f32> {
  %y = torch.operator "torch.day0.mxfp4_moe"(%x, %p, %s, %e) : (!torch.vtensor<[1,64],f32>, !torch.vtensor<[4,8,32],ui8>, !torch.vtensor<[4,8,2],ui8>, !torch.vtensor<[1,2],si64>) -> !torch.vtensor<[1,2,8],f32>
  return %y : !torch.vtensor<[1,2,8],f32>
}
// CHECK-LABEL: func.func @moe_decode(
// CHECK-NEXT:  [[X:%.+]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[1,64],f32> -> tensor<1x64xf32>
// CHECK-NEXT:  %int-1 = torch.constant.int -1
// CHECK-NEXT:  %int0 = torch.constant.int 0
// CHECK-NEXT:  [[FLAT:%.+]] = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
// CHECK-NEXT:  [[EF:%.+]] = torch.aten.view %arg3, [[FLAT]] : !torch.vtensor<[1,2],si64>, !torch.list<int> -> !torch.vtensor<[2],si64>
// CHECK-NEXT:  [[PG:%.+]] = torch.aten.index_select %arg1, %int0, [[EF]] : !torch.vtensor<[4,8,32],ui8>, !torch.int, !torch.vtensor<[2],si64> -> !torch.vtensor<[2,8,32],ui8>
// CHECK-NEXT:  [[SG:%.+]] = torch.aten.index_select %arg2, %int0, [[EF]] : !torch.vtensor<[4,8,2],ui8>, !torch.int, !torch.vtensor<[2],si64> -> !torch.vtensor<[2,8,2],ui8>
// CHECK-NEXT:  [[PF:%.+]] = torch_c.to_builtin_tensor [[PG]] : !torch.vtensor<[2,8,32],ui8> -> tensor<2x8x32xi8>
// CHECK-NEXT:  [[SF:%.+]] = torch_c.to_builtin_tensor [[SG]] : !torch.vtensor<[2,8,2],ui8> -> tensor<2x8x2xi8>
// CHECK-NEXT:  [[PB:%.+]] = tensor.expand_shape [[PF]] {{\[\[}}0, 1], [2], [3]] output_shape [1, 2, 8, 32] : tensor<2x8x32xi8> into tensor<1x2x8x32xi8>
// CHECK-NEXT:  [[SB:%.+]] = tensor.expand_shape [[SF]] {{\[\[}}0, 1], [2], [3]] output_shape [1, 2, 8, 2] : tensor<2x8x2xi8> into tensor<1x2x8x2xi8>
// CHECK-NEXT:  tensor.expand_shape [[X]]
// CHECK:       util.optimization_barrier
// CHECK:       [[PK:%.+]] = tensor.expand_shape [[PB]] {{\[\[}}0], [1], [2], [3, 4]] output_shape [1, 2, 8, 2, 16] : tensor<1x2x8x32xi8> into tensor<1x2x8x2x16xi8>
// CHECK-NEXT:  [[OE:%.+]] = tensor.empty() : tensor<1x2x8xf32>
// CHECK-NEXT:  [[ZERO:%.+]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:  [[ACC:%.+]] = linalg.fill ins([[ZERO]] : f32) outs([[OE]] : tensor<1x2x8xf32>) -> tensor<1x2x8xf32>
// CHECK-NEXT:  [[R:%.+]] = linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction"]} ins({{%.+}}, {{%.+}}, [[PK]], [[SB]] : tensor<1x2x16xf32>, tensor<1x2x16xf32>, tensor<1x2x8x2x16xi8>, tensor<1x2x8x2xi8>) outs([[ACC]] : tensor<1x2x8xf32>) {
// CHECK:       } -> tensor<1x2x8xf32>
// CHECK-NEXT:  [[Y:%.+]] = torch_c.from_builtin_tensor [[R]] : tensor<1x2x8xf32> -> !torch.vtensor<[1,2,8],f32>
// CHECK-NEXT:  return [[Y]] : !torch.vtensor<[1,2,8],f32>

// Prefill moe (dynamic T, si32 expert ids): the fused form under every option (each row gathers
// its own experts, so a dequantized temporary would amortize nothing); never a [T, k, N, K] f32.
// CHECK-NOT: tensor<?x2x8x64xf32>
func.func @moe_prefill(%x: !torch.vtensor<[?,64],f32>, %p: !torch.vtensor<[4,8,32],ui8>, %s: !torch.vtensor<[4,8,2],ui8>, %e: !torch.vtensor<[?,2],si32>) -> !torch.vtensor<[?,2,8],f32> {
  %y = torch.operator "torch.day0.mxfp4_moe"(%x, %p, %s, %e) : (!torch.vtensor<[?,64],f32>, !torch.vtensor<[4,8,32],ui8>, !torch.vtensor<[4,8,2],ui8>, !torch.vtensor<[?,2],si32>) -> !torch.vtensor<[?,2,8],f32>
  return %y : !torch.vtensor<[?,2,8],f32>
}
// CHECK-LABEL: func.func @moe_prefill(
// CHECK:       torch.aten.index_select %arg1, %int0, {{%.+}} : !torch.vtensor<[4,8,32],ui8>, !torch.int, !torch.vtensor<[?],si32> -> !torch.vtensor<[?,8,32],ui8>
// CHECK:       linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction"]} ins({{.*}} : tensor<?x2x16xf32>, tensor<?x2x16xf32>, tensor<?x2x8x2x16xi8>, tensor<?x2x8x2xi8>) outs({{%.+}} : tensor<?x2x8xf32>)
// CHECK:       return {{%.+}} : !torch.vtensor<[?,2,8],f32>
