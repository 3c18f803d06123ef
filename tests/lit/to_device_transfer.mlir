// RUN: day0-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(to-device-transfer{devices=2})' | filecheck %s

// A value moved to device 1 and its result back to device 0: IREE transfers.
// CHECK-LABEL: func.func @moved
// CHECK:       %[[B:.*]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[3,8],f32> -> tensor<3x8xf32>
// CHECK:       %[[T:.*]] = flow.tensor.transfer %[[B]] : tensor<3x8xf32> to #hal.device.promise<@__device_1>
// CHECK:       %[[V:.*]] = torch_c.from_builtin_tensor %[[T]] : tensor<3x8xf32> -> !torch.vtensor<[3,8],f32>
// CHECK:       %[[N:.*]] = torch.aten.neg %[[V]]
// CHECK:       flow.tensor.transfer %{{.*}} : tensor<3x8xf32> to #hal.device.promise<@__device_0>
// CHECK-NOT:   torch.day0.to_device
func.func @moved(%x: !torch.vtensor<[3,8],f32>) -> !torch.vtensor<[3,8],f32> {
  %int1 = torch.constant.int 1
  %int0 = torch.constant.int 0
  %0 = torch.operator "torch.day0.to_device"(%x, %int1) : (!torch.vtensor<[3,8],f32>, !torch.int) -> !torch.vtensor<[3,8],f32>
  %1 = torch.aten.neg %0 : !torch.vtensor<[3,8],f32> -> !torch.vtensor<[3,8],f32>
  %2 = torch.operator "torch.day0.to_device"(%1, %int0) : (!torch.vtensor<[3,8],f32>, !torch.int) -> !torch.vtensor<[3,8],f32>
  return %2 : !torch.vtensor<[3,8],f32>
}

// -----

// Dynamic dims travel with the transfer.
// CHECK-LABEL: func.func @dynamic
// CHECK:       %[[B:.*]] = torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[?,4],si64> -> tensor<?x4xi64>
// CHECK:       %[[D:.*]] = tensor.dim %[[B]], %{{.*}} : tensor<?x4xi64>
// CHECK:       flow.tensor.transfer %[[B]] : tensor<?x4xi64>{%[[D]]} to #hal.device.promise<@__device_1>
func.func @dynamic(%x: !torch.vtensor<[?,4],si64>) -> !torch.vtensor<[?,4],si64> {
  %int1 = torch.constant.int 1
  %0 = torch.operator "torch.day0.to_device"(%x, %int1) : (!torch.vtensor<[?,4],si64>, !torch.int) -> !torch.vtensor<[?,4],si64>
  return %0 : !torch.vtensor<[?,4],si64>
}

// -----

// A hoisted stack (a global, read through a reshape) is placed on the device instead of moved:
// the global, and the parameters its own initializer reads, get the device's affinity; a
// parameter no placed stack reads keeps none.
// CHECK:       util.global private @e0 {stream.affinity = #hal.device.affinity<@__device_1>} = #flow.parameter.named<"model"::"e0">
// CHECK:       util.global private @e1 {stream.affinity = #hal.device.affinity<@__device_1>} = #flow.parameter.named<"model"::"e1">
// CHECK:       util.global private @other = #flow.parameter.named<"model"::"other">
// CHECK:       util.global private @stack {stream.affinity = #hal.device.affinity<@__device_1>} : tensor<4x2xi8>
// CHECK-LABEL: func.func @placed
// CHECK:       %[[G:.*]] = util.global.load @stack
// CHECK:       %[[R:.*]] = tensor.expand_shape %[[G]]
// CHECK:       %[[T:.*]] = torch_c.from_builtin_tensor %[[R]]
// CHECK:       return %[[T]]
// CHECK-NOT:   flow.tensor.transfer
util.global private @e0 = #flow.parameter.named<"model"::"e0"> : tensor<2x2xi8>
util.global private @e1 = #flow.parameter.named<"model"::"e1"> : tensor<2x2xi8>
util.global private @other = #flow.parameter.named<"model"::"other"> : tensor<2x2xi8>
util.global private @stack : tensor<4x2xi8>
util.initializer {
  %a = util.global.load @e0 : tensor<2x2xi8>
  %b = util.global.load @e1 : tensor<2x2xi8>
  %c = tensor.concat dim(0) %a, %b : (tensor<2x2xi8>, tensor<2x2xi8>) -> tensor<4x2xi8>
  util.global.store %c, @stack : tensor<4x2xi8>
  util.return
}
func.func @placed() -> !torch.vtensor<[2,2,2],ui8> {
  %int1 = torch.constant.int 1
  %g = util.global.load @stack : tensor<4x2xi8>
  %r = tensor.expand_shape %g [[0, 1], [2]] output_shape [2, 2, 2] : tensor<4x2xi8> into tensor<2x2x2xi8>
  %t = torch_c.from_builtin_tensor %r : tensor<2x2x2xi8> -> !torch.vtensor<[2,2,2],ui8>
  %0 = torch.operator "torch.day0.to_device"(%t, %int1) : (!torch.vtensor<[2,2,2],ui8>, !torch.int) -> !torch.vtensor<[2,2,2],ui8>
  return %0 : !torch.vtensor<[2,2,2],ui8>
}

// -----

func.func @out_of_range(%x: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %int2 = torch.constant.int 2
  // expected-error @+1 {{torch.day0.to_device: device 2 is not a constant in [0, 2)}}
  %0 = torch.operator "torch.day0.to_device"(%x, %int2) : (!torch.vtensor<[4],f32>, !torch.int) -> !torch.vtensor<[4],f32>
  return %0 : !torch.vtensor<[4],f32>
}

// -----

func.func @bad_type(%x: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],si64> {
  %int1 = torch.constant.int 1
  // expected-error @+1 {{torch.day0.to_device takes a tensor and a device index and returns a tensor of its type}}
  %0 = torch.operator "torch.day0.to_device"(%x, %int1) : (!torch.vtensor<[4],f32>, !torch.int) -> !torch.vtensor<[4],si64>
  return %0 : !torch.vtensor<[4],si64>
}

// -----

util.global private @w = #flow.parameter.named<"model"::"w"> : tensor<2xi8>
func.func @two_devices() -> (!torch.vtensor<[2],ui8>, !torch.vtensor<[2],ui8>) {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %g = util.global.load @w : tensor<2xi8>
  %t = torch_c.from_builtin_tensor %g : tensor<2xi8> -> !torch.vtensor<[2],ui8>
  %0 = torch.operator "torch.day0.to_device"(%t, %int0) : (!torch.vtensor<[2],ui8>, !torch.int) -> !torch.vtensor<[2],ui8>
  // expected-error @+1 {{torch.day0.to_device: global @w is placed on device 0 and on device 1}}
  %1 = torch.operator "torch.day0.to_device"(%t, %int1) : (!torch.vtensor<[2],ui8>, !torch.int) -> !torch.vtensor<[2],ui8>
  return %0, %1 : !torch.vtensor<[2],ui8>, !torch.vtensor<[2],ui8>
}
