// RUN: day0-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(parameters-to-globals)'
// RUN: not day0-opt %s --pass-pipeline='builtin.module(parameters-to-globals{scope=""})' 2>&1 | filecheck %s --check-prefix=BADSCOPE

// BADSCOPE: pass 'parameters-to-globals': scope must be a non-empty name without quotes, got ''

// The same key with two types.
func.func @a() -> !torch.vtensor<[64,32],f32> {
  %w = torch.operator "torch.day0.parameter"() {day0.key = "w"} : () -> !torch.vtensor<[64,32],f32>
  return %w : !torch.vtensor<[64,32],f32>
}
func.func @b() -> !torch.vtensor<[32,64],f32> {
  // expected-error @+1 {{parameter 'w' has type !torch.vtensor<[32,64],f32> here but !torch.vtensor<[64,32],f32> at}}
  %w = torch.operator "torch.day0.parameter"() {day0.key = "w"} : () -> !torch.vtensor<[32,64],f32>
  return %w : !torch.vtensor<[32,64],f32>
}

// -----

// No key.
func.func @no_key() -> !torch.vtensor<[4],f32> {
  // expected-error @+1 {{parameter: missing 'day0.key' string attribute}}
  %w = torch.operator "torch.day0.parameter"() : () -> !torch.vtensor<[4],f32>
  return %w : !torch.vtensor<[4],f32>
}

// -----

// A key that is not a string.
func.func @int_key() -> !torch.vtensor<[4],f32> {
  // expected-error @+1 {{parameter: 'day0.key' must be a string, got 3 : i64}}
  %w = torch.operator "torch.day0.parameter"() {day0.key = 3} : () -> !torch.vtensor<[4],f32>
  return %w : !torch.vtensor<[4],f32>
}

// -----

// A parameter has a static shape.
func.func @dynamic() -> !torch.vtensor<[?],f32> {
  // expected-error @+1 {{parameter 'w': type must be a static-shaped !torch.vtensor, got !torch.vtensor<[?],f32>}}
  %w = torch.operator "torch.day0.parameter"() {day0.key = "w"} : () -> !torch.vtensor<[?],f32>
  return %w : !torch.vtensor<[?],f32>
}
