"""fuse-mxfp4-matmul: expand `torch.day0.mxfp4_linear` / `mxfp4_moe` into MXFP4 unpack inside the
matmul's reduction, so that IREE forms one dispatch per matmul and no dequantized weight exists.

Precondition: raw torch IR from torch-mlir whose ops keep their contract (passes/sites/mxfp4.py):
mxfp4_linear takes x [M, K] f32, packed [N, K/2] ui8 and scales [N, K/32] ui8 to [M, N] f32;
mxfp4_moe takes x [T, K], packed [E, N, K/2], scales [E, N, K/32] and integer experts [T, k] to
[T, k, N] f32; N, K, E, k static, K a multiple of 32, M / T may be dynamic. Afterwards no such
op is left.
Every op is rewritten between torch_c.to_builtin_tensor / from_builtin_tensor into linalg on
builtin tensors (the experts' rows are gathered first with torch index_select: u8, packed size).

Decoding one byte (low nibble = even element): code c = nibble & 7, sign = nibble & 8;
2·|E2M1[c]| = (0xC8643210 >> 4c) & 15 (the table 0,1,2,3,4,6,8,12 as 4-bit fields);
value = ±that · 0.5 · 2^(s−127) with 2^(s−127) = bitcast<f32>(s << 23), exact for s in 1..254
(E8M0 0 → 0 instead of 2^−127, 255 (NaN) → inf: neither occurs in real checkpoints).

Fused form (decode, M/T == 1; also prefill with prefill=fused):
    xt   = barrier(0.5 · transpose(x as [M, K/2, 2]))            # [M, 2, K/2], tiny
    xlo, xhi = xt[:, 0], xt[:, 1]  as [M, K/32, 16]                # even / odd elements
    y[m, n] = Σ_g Σ_b (xlo[m,g,b]·dec(p[n,g,b] & 15) + xhi[m,g,b]·dec(p[n,g,b] >> 4)) · 2^(s[n,g]−127)
as ONE linalg.generic (m, n | g, b) reading the packed bytes and the scales directly.
The barrier keeps the deinterleave of x in its own small dispatch (one transpose of K floats):
fused into the contraction it makes every weight row read x with stride 2, which made the
matvec several times slower in a hand-written prototype (iree-benchmark-module).
moe: the same contraction over (t, j, n | g, b) on the gathered [T, k, N, K/32, 16] bytes.

Unfused form (prefill=unfused, the default for mxfp4_linear with M != 1): dequantize into a
temporary f32 weight [N, K] behind a `util.optimization_barrier` (IREE's aggressive
fusion would otherwise put the unpack back into the matmul), then `linalg.matmul` (moe: a
generic contraction). On the CPU the fused form wins decode by far and the unfused one wins
prefill (`python -m day0.tools.bench.bench_mxfp4`; measured: docs/perf.md, "CPU, MXFP4 expert
matvec"): default prefill=unfused.
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import Module, Operation
from day0.passes.base import DiagnosticEngine, ModulePass, collect_sites, operator_name
from day0.passes.sites.mxfp4 import OP_NAMES, Mxfp4Site, match_mxfp4
from day0.passes.torch_ir import fmt_dim

_LUT = sum(v << (4 * c) for c, v in enumerate((0, 1, 2, 3, 4, 6, 8, 12)))  # 2·|E2M1[c]|, 4 bits each
_PREFILL_FORMS = ("fused", "unfused")


# ---------------------------------------------------------------------------------------------
# the rewrite, written as IR templates: parsed as a function, then its body moved before the op


def _decode(nib: str, out: str) -> str:
    """i32 %nib (a 4-bit code) -> f32 %out = ±2·|E2M1|."""
    return f"""
      %{out}c = arith.andi %{nib}, %c7 : i32
      %{out}sh = arith.shli %{out}c, %c2 : i32
      %{out}l = arith.shrui %lut, %{out}sh : i32
      %{out}m = arith.andi %{out}l, %c15 : i32
      %{out}f = arith.uitofp %{out}m : i32 to f32
      %{out}s0 = arith.andi %{nib}, %c8 : i32
      %{out}s = arith.shli %{out}s0, %c28 : i32
      %{out}b = arith.bitcast %{out}f : f32 to i32
      %{out}v = arith.ori %{out}b, %{out}s : i32
      %{out} = arith.bitcast %{out}v : i32 to f32"""


_CONSTS = f"""
      %c2 = arith.constant 2 : i32
      %c4 = arith.constant 4 : i32
      %c7 = arith.constant 7 : i32
      %c8 = arith.constant 8 : i32
      %c15 = arith.constant 15 : i32
      %c23 = arith.constant 23 : i32
      %c28 = arith.constant 28 : i32
      %lut = arith.constant {_LUT} : i32"""

# 2^(s-127) from the E8M0 byte %sc
_SCALE = """
      %s32 = arith.extui %sc : i8 to i32
      %sbits = arith.shli %s32, %c23 : i32
      %scale = arith.bitcast %sbits : i32 to f32"""


def _maps(n: int, *results: str) -> str:
    dims = ", ".join(f"d{i}" for i in range(n))
    return "[" + ", ".join(f"affine_map<({dims}) -> ({r})>" for r in results) + "]"


def _iters(parallel: int, reduction: int) -> str:
    return "[" + ", ".join(['"parallel"'] * parallel + ['"reduction"'] * reduction) + "]"


def _shape(*dims) -> str:
    return "x".join("?" if d is None else str(d) for d in dims)


class _Template:
    """Shapes and text pieces shared by the forms of one site."""

    def __init__(self, site: Mxfp4Site):
        self.s = site
        K = site.K
        self.KB, self.G = K // 2, K // 32
        L = site.lead
        self.L = L
        self.dyn = L is None
        self.lead = "%lead" if self.dyn else str(L)  # as an SSA size operand or a literal
        self.dyn_sizes = "%lead" if self.dyn else ""

    def signature(self) -> str:
        s = self.s
        x = f"!torch.vtensor<[{fmt_dim(s.lead)},{s.K}],f32>"
        e = [s.E] if s.moe else []
        p = f"!torch.vtensor<[{','.join(map(str, [*e, s.N, self.KB]))}],ui8>"
        sc = f"!torch.vtensor<[{','.join(map(str, [*e, s.N, self.G]))}],ui8>"
        args = [f"%x: {x}", f"%p: {p}", f"%s: {sc}"]
        if s.moe:
            args.append(f"%experts: !torch.vtensor<[{fmt_dim(s.lead)},{s.k}],{s.experts_dtype}>")
        return ", ".join(args)

    def result_type(self) -> str:
        s = self.s
        return (
            f"!torch.vtensor<[{fmt_dim(s.lead)},{s.k},{s.N}],f32>"
            if s.moe
            else f"!torch.vtensor<[{fmt_dim(s.lead)},{s.N}],f32>"
        )

    def inputs(self) -> str:
        """x to builtin (+ its dynamic row count), the weight's bytes and scales (gathered for moe)."""
        s, L, K, KB, G, N = self.s, self.L, self.s.K, self.KB, self.G, self.s.N
        text = f"""
  %xb = torch_c.to_builtin_tensor %x : !torch.vtensor<[{fmt_dim(L)},{K}],f32> -> tensor<{_shape(L, K)}xf32>"""
        if self.dyn:
            text += f"""
  %c0 = arith.constant 0 : index
  %lead = tensor.dim %xb, %c0 : tensor<?x{K}xf32>"""
        if not s.moe:
            return (
                text
                + f"""
  %pb = torch_c.to_builtin_tensor %p : !torch.vtensor<[{N},{KB}],ui8> -> tensor<{N}x{KB}xi8>
  %sb = torch_c.to_builtin_tensor %s : !torch.vtensor<[{N},{G}],ui8> -> tensor<{N}x{G}xi8>"""
            )
        E, k, ed = s.E, s.k, s.experts_dtype
        Tk = None if self.dyn else L * k
        # packed[experts], scales[experts]: one index_select of the flattened [T·k] choices each
        return (
            text
            + f"""
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %flat = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
  %ef = torch.aten.view %experts, %flat : !torch.vtensor<[{fmt_dim(L)},{k}],{ed}>, !torch.list<int> -> !torch.vtensor<[{fmt_dim(Tk)}],{ed}>
  %pg = torch.aten.index_select %p, %int0, %ef : !torch.vtensor<[{E},{N},{KB}],ui8>, !torch.int, !torch.vtensor<[{fmt_dim(Tk)}],{ed}> -> !torch.vtensor<[{fmt_dim(Tk)},{N},{KB}],ui8>
  %sg = torch.aten.index_select %s, %int0, %ef : !torch.vtensor<[{E},{N},{G}],ui8>, !torch.int, !torch.vtensor<[{fmt_dim(Tk)}],{ed}> -> !torch.vtensor<[{fmt_dim(Tk)},{N},{G}],ui8>
  %pf = torch_c.to_builtin_tensor %pg : !torch.vtensor<[{fmt_dim(Tk)},{N},{KB}],ui8> -> tensor<{_shape(Tk, N, KB)}xi8>
  %sf = torch_c.to_builtin_tensor %sg : !torch.vtensor<[{fmt_dim(Tk)},{N},{G}],ui8> -> tensor<{_shape(Tk, N, G)}xi8>
  %pb = tensor.expand_shape %pf [[0, 1], [2], [3]] output_shape [{self.lead}, {k}, {N}, {KB}] : tensor<{_shape(Tk, N, KB)}xi8> into tensor<{_shape(L, k, N, KB)}xi8>
  %sb = tensor.expand_shape %sf [[0, 1], [2], [3]] output_shape [{self.lead}, {k}, {N}, {G}] : tensor<{_shape(Tk, N, G)}xi8> into tensor<{_shape(L, k, N, G)}xi8>"""
        )

    def barrier(self, out: str, value: str, ty: str) -> str:
        """`util.optimization_barrier`: IREE fuses nothing across it. Its result's dynamic
        row count is unknown to IREE's shape resolution: tie it to %lead again."""
        if "?" not in ty:
            return f"{out} = util.optimization_barrier {value} : {ty}"
        return (
            f"{out}_b = util.optimization_barrier {value} : {ty}\n"
            f"  {out} = flow.tensor.tie_shape {out}_b : {ty}{{%lead}}"
        )

    def output(self) -> tuple[str, str]:
        """(the zero-filled accumulator %acc, its builtin type)."""
        s, L = self.s, self.L
        dims = (L, s.k, s.N) if s.moe else (L, s.N)
        ty = f"tensor<{_shape(*dims)}xf32>"
        return (
            f"""
  %oe = tensor.empty({self.dyn_sizes}) : {ty}
  %zero = arith.constant 0.0 : f32
  %acc = linalg.fill ins(%zero : f32) outs(%oe : {ty}) -> {ty}""",
            ty,
        )

    def fused(self) -> str:
        s, L, K, KB, G, N = self.s, self.L, self.s.K, self.KB, self.G, self.s.N
        lead = self.lead
        # x: [L, K] -> [L, K/2, 2] -> 0.5 · [L, 2, K/2] (barrier) -> even / odd halves [L, G, 16]
        text = (
            self.inputs()
            + f"""
  %x3 = tensor.expand_shape %xb [[0], [1, 2]] output_shape [{lead}, {KB}, 2] : tensor<{_shape(L, K)}xf32> into tensor<{_shape(L, KB, 2)}xf32>
  %xte = tensor.empty({self.dyn_sizes}) : tensor<{_shape(L, 2, KB)}xf32>
  %xt = linalg.generic {{indexing_maps = {_maps(3, "d0, d2, d1", "d0, d1, d2")}, iterator_types = {_iters(3, 0)}}} ins(%x3 : tensor<{_shape(L, KB, 2)}xf32>) outs(%xte : tensor<{_shape(L, 2, KB)}xf32>) {{
    ^bb0(%v: f32, %o: f32):
      %half = arith.constant 0.5 : f32
      %hv = arith.mulf %v, %half : f32
      linalg.yield %hv : f32
  }} -> tensor<{_shape(L, 2, KB)}xf32>
  {self.barrier("%xtb", "%xt", f"tensor<{_shape(L, 2, KB)}xf32>")}
  %xlo2 = tensor.extract_slice %xtb[0, 0, 0] [{lead}, 1, {KB}] [1, 1, 1] : tensor<{_shape(L, 2, KB)}xf32> to tensor<{_shape(L, KB)}xf32>
  %xhi2 = tensor.extract_slice %xtb[0, 1, 0] [{lead}, 1, {KB}] [1, 1, 1] : tensor<{_shape(L, 2, KB)}xf32> to tensor<{_shape(L, KB)}xf32>
  %xlo = tensor.expand_shape %xlo2 [[0], [1, 2]] output_shape [{lead}, {G}, 16] : tensor<{_shape(L, KB)}xf32> into tensor<{_shape(L, G, 16)}xf32>
  %xhi = tensor.expand_shape %xhi2 [[0], [1, 2]] output_shape [{lead}, {G}, 16] : tensor<{_shape(L, KB)}xf32> into tensor<{_shape(L, G, 16)}xf32>"""
        )
        if s.moe:
            wdims, sdims = (L, s.k, N, KB), (L, s.k, N, G)
            reassoc = "[[0], [1], [2], [3, 4]]"
            pshape = (L, s.k, N, G, 16)
            # (t, j, n | g, b)
            maps = _maps(5, "d0, d3, d4", "d0, d3, d4", "d0, d1, d2, d3, d4", "d0, d1, d2, d3", "d0, d1, d2")
            iters = _iters(3, 2)
            out_sizes = f"[{lead}, {s.k}, {N}, {G}, 16]"
        else:
            wdims, sdims = (N, KB), (N, G)
            reassoc = "[[0], [1, 2]]"
            pshape = (N, G, 16)
            # (m, n | g, b)
            maps = _maps(4, "d0, d2, d3", "d0, d2, d3", "d1, d2, d3", "d1, d2", "d0, d1")
            iters = _iters(2, 2)
            out_sizes = f"[{N}, {G}, 16]"
        acc, oty = self.output()
        return (
            text
            + f"""
  %pk = tensor.expand_shape %pb {reassoc} output_shape {out_sizes} : tensor<{_shape(*wdims)}xi8> into tensor<{_shape(*pshape)}xi8>{acc}
  %r = linalg.generic {{indexing_maps = {maps}, iterator_types = {iters}}} ins(%xlo, %xhi, %pk, %sb : tensor<{_shape(L, G, 16)}xf32>, tensor<{_shape(L, G, 16)}xf32>, tensor<{_shape(*pshape)}xi8>, tensor<{_shape(*sdims)}xi8>) outs(%acc : {oty}) {{
    ^bb0(%xl: f32, %xh: f32, %byte: i8, %sc: i8, %o: f32):{_CONSTS}
      %b = arith.extui %byte : i8 to i32
      %lo = arith.andi %b, %c15 : i32
      %hi = arith.shrui %b, %c4 : i32{_decode("lo", "wl")}{_decode("hi", "wh")}{_SCALE}
      %pl = arith.mulf %xl, %wl : f32
      %ph = arith.mulf %xh, %wh : f32
      %pp = arith.addf %pl, %ph : f32
      %ps = arith.mulf %pp, %scale : f32
      %sum = arith.addf %o, %ps : f32
      linalg.yield %sum : f32
  }} -> {oty}"""
        )

    def unfused(self) -> str:
        s, L, K, KB, G, N = self.s, self.L, self.s.K, self.KB, self.G, self.s.N
        lead = self.lead
        lw = (L, s.k) if s.moe else ()  # leading dims of the (gathered) weight
        n = len(lw)
        wdims, sdims = (*lw, N, KB), (*lw, N, G)
        pshape, wshape = (*lw, N, G, 16), (*lw, N, G, 16, 2)
        idx = ", ".join(f"d{i}" for i in range(n + 4))
        p_map, s_map = ", ".join(f"d{i}" for i in range(n + 3)), ", ".join(f"d{i}" for i in range(n + 2))
        reassoc = "[" + ", ".join([f"[{i}]" for i in range(n + 1)] + [f"[{n + 1}, {n + 2}]"]) + "]"
        collapse = "[" + ", ".join([f"[{i}]" for i in range(n + 1)] + [f"[{n + 1}, {n + 2}, {n + 3}]"]) + "]"
        psizes = ", ".join([lead, str(s.k)][:n] + [str(N), str(G), "16"])
        acc, oty = self.output()
        text = (
            self.inputs()
            + f"""
  %pk = tensor.expand_shape %pb {reassoc} output_shape [{psizes}] : tensor<{_shape(*wdims)}xi8> into tensor<{_shape(*pshape)}xi8>
  %we = tensor.empty({self.dyn_sizes if s.moe else ""}) : tensor<{_shape(*wshape)}xf32>
  %w6 = linalg.generic {{indexing_maps = {_maps(n + 4, p_map, s_map, idx)}, iterator_types = {_iters(n + 4, 0)}}} ins(%pk, %sb : tensor<{_shape(*pshape)}xi8>, tensor<{_shape(*sdims)}xi8>) outs(%we : tensor<{_shape(*wshape)}xf32>) {{
    ^bb0(%byte: i8, %sc: i8, %o: f32):{_CONSTS}
      %j = linalg.index {n + 3} : index
      %j32 = arith.index_cast %j : index to i32
      %jsh = arith.shli %j32, %c2 : i32
      %b = arith.extui %byte : i8 to i32
      %nb = arith.shrui %b, %jsh : i32
      %nib = arith.andi %nb, %c15 : i32{_decode("nib", "w2")}{_SCALE}
      %half = arith.constant 0.5 : f32
      %w1 = arith.mulf %w2, %half : f32
      %w = arith.mulf %w1, %scale : f32
      linalg.yield %w : f32
  }} -> tensor<{_shape(*wshape)}xf32>
  %wc = tensor.collapse_shape %w6 {collapse} : tensor<{_shape(*wshape)}xf32> into tensor<{_shape(*lw, N, K)}xf32>
  {self.barrier("%wt", "%wc", f"tensor<{_shape(*lw, N, K)}xf32>")}{acc}"""
        )
        if not s.moe:
            return (
                text
                + f"""
  %r = linalg.matmul indexing_maps = {_maps(3, "d0, d2", "d1, d2", "d0, d1")} ins(%xb, %wt : tensor<{_shape(L, K)}xf32>, tensor<{N}x{K}xf32>) outs(%acc : {oty}) -> {oty}"""
            )
        # (t, j, n | kk)
        return (
            text
            + f"""
  %r = linalg.generic {{indexing_maps = {_maps(4, "d0, d3", "d0, d1, d2, d3", "d0, d1, d2")}, iterator_types = {_iters(3, 1)}}} ins(%xb, %wt : tensor<{_shape(L, K)}xf32>, tensor<{_shape(*lw, N, K)}xf32>) outs(%acc : {oty}) {{
    ^bb0(%xv: f32, %wv: f32, %o: f32):
      %prod = arith.mulf %xv, %wv : f32
      %sum = arith.addf %o, %prod : f32
      linalg.yield %sum : f32
  }} -> {oty}"""
        )

    def function(self, fused: bool) -> str:
        s, L = self.s, self.L
        dims = (L, s.k, s.N) if s.moe else (L, s.N)
        body = self.fused() if fused else self.unfused()
        return f"""func.func @mxfp4({self.signature()}) -> {self.result_type()} {{{body}
  %y = torch_c.from_builtin_tensor %r : tensor<{_shape(*dims)}xf32> -> {self.result_type()}
  return %y : {self.result_type()}
}}"""


def _rewrite(site: Mxfp4Site, fused: bool) -> None:
    """Parse the form's function in the op's context, move its body before the op, rewire."""
    op = site.op
    template = Module.parse(_Template(site).function(fused), op.context)
    func = template.body.operations[0]
    block = func.regions[0].blocks[0]
    for arg, real in zip(block.arguments, op.operands):
        arg.replace_all_uses_with(real)
    body = list(block.operations)
    ret = body[-1]
    for inner in body[:-1]:
        inner.move_before(op)
    op.result.replace_all_uses_with(ret.operands[0])
    op.erase()


def _refuse(site: Mxfp4Site) -> str | None:
    """mxfp4_moe_swiglu is cuda-sm90's form (export keeps it only for targets whose kernel stages
    x through the SwiGLU); elsewhere export writes its reference body."""
    if site.swiglu:
        return "mxfp4_moe_swiglu has no CPU lowering: export keeps it whole only for cuda-sm90 (frontend/ops.py)"
    return None


@dataclass(frozen=True)
class FuseMxfp4Matmul(ModulePass):
    """Options:
    prefill  the form of an `mxfp4_linear` whose row count M is not statically 1: `unfused`
             (default: dequantize to a temporary f32 weight, then a plain matmul; faster than
             fused for prefill on the CPU) or `fused` (the decode form). `mxfp4_moe` is always
             fused: its rows gather their own experts' weights, so nothing amortizes a temporary.
    """

    name = "fuse-mxfp4-matmul"
    prefill: str = "unfused"

    def __post_init__(self):
        if self.prefill not in _PREFILL_FORMS:
            raise ValueError(f"prefill must be one of {', '.join(_PREFILL_FORMS)}, got '{self.prefill}'")

    def apply(self, module_op: Operation, diag: DiagnosticEngine) -> None:
        for site in collect_sites(module_op, lambda op: operator_name(op) in OP_NAMES, match_mxfp4, diag, _refuse):
            with site.op.location:
                # moe rows never share a weight (each (token, expert) pair gathers its own), so a
                # dequantized temporary buys nothing there: moe is always fused.
                _rewrite(site, fused=site.moe or site.lead == 1 or self.prefill == "fused")
