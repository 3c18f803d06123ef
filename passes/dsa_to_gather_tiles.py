"""dsa-to-gather-tiles: expand `torch.day0.dsa_attention` into gathered tiles + online softmax.

Precondition: the module is raw torch IR from torch-mlir; every `torch.day0.dsa_attention` keeps
the op's contract (passes/sites/dsa_attention.py):

    %o = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim)
         : (!torch.vtensor<[S,H,D],f>, !torch.vtensor<[T,D],f>, !torch.vtensor<[S,K],i>,
            !torch.float, !torch.int) -> !torch.vtensor<[S,H,V],f32>

static H, D, K (S and T may be `?`: T is a paged pool's rows), f (q and kv alike) f32, bf16 or f16, i si64 or si32, the result
f32 whatever f is. Afterwards no dsa_attention op is left: only aten ops that torch-mlir lowers, so
`iree-compile --iree-input-type=torch` takes the result.

The K selected slots are processed in K/tile tiles of `tile` consecutive slots (unrolled: the
count is static). Per tile j, with sel = idx[:, j·t:(j+1)·t] and valid = sel >= 0:
    rows = kv[clamp(sel, 0)]                       # gather       [S, t, D]
    s    = where(valid, scale · q·rowsᵀ, NEG)      # scores       [S, H, t]
    m'   = max(m, rowmax(s))                        # running max  [S, H, 1]
    p    = where(valid, exp(s - m'), 0)             # empty slots contribute exactly 0
    l'   = l·exp(m - m') + Σp                       # running sum  [S, H, 1]
    acc' = acc·exp(m - m') + p·rows[..., :V]        # accumulator  [S, H, V]
and out = acc / max(l, tiny) (a query with only empty slots has acc = l = 0 -> out = 0).
NEG is a large finite negative: with -inf an all-empty tile would give exp(-inf - -inf) = NaN.
The first tile initialises (m, l, acc) directly, so no [S, H, 1] fill is needed.

bf16/f16 io: q and the gathered rows are widened to f32 (exact) and the f32 out is the result
as is: no rounding, no narrowing. For bf16, the widened q is rounded to nearest-even bf16 on its
f32 bits (integer ops; a no-op on real bf16 values), so the caller's f32 -> bf16 narrowing of q
survives even if it lands in the dispatch that widens it: a bare f32 -> bf16 -> f32 round trip
does not survive IREE's CPU codegen when the narrowing and the widening land in one dispatch
(iree-convert-bf16-arith-to-f32 turns both into no-ops, and q would enter unrounded).

Decode form (S == 1): q is viewed as [H, D] and every product is an `mm` (matvec-shaped).
Prefill form (S dynamic or > 1): batched over queries with `bmm`; the only queries × keys tensor
is one tile's scores [S, H, tile]. Neither form materialises a seq × seq (or T × T) tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import Operation, Value
from day0.passes.base import DiagnosticEngine, ModulePass, collect_sites, operator_name
from day0.passes.sites.dsa_attention import OP_NAME, DsaAttentionSite, match_dsa_attention
from day0.passes.torch_ir import SCALAR_TYPE, TensorType, TorchBuilder, replace_op

_NEG = -1.0e30  # a large finite negative: the math is f32 whatever the io dtype
_TINY = 1.0e-30  # l is 0 (all slots empty) or >= 1 (the max slot adds exp(0))


def _rewrite(site: DsaAttentionSite, tile: int, block: int = 0) -> Value:
    """Emit the tiled online softmax before `site.op`; return the [S, H, V] result value.
    block > 0: tiles of `block` slots (the last one may be shorter), each gathered as one
    aligned block of the cache viewed [T/block, block, D] (the option's precondition)."""
    b = TorchBuilder(site.op)
    S, H, D, K, V, io = site.S, site.H, site.D, site.K, site.V, site.dtype
    decode = S == 1
    # The math runs in f32 whatever the io dtype: bf16 scores, max and sums over K slots lost ~2%
    # (q and the gathered rows are widened; the result is f32 too).
    f = "f32"
    T = lambda *dims, dtype=f: TensorType(tuple(dims), dtype)  # noqa: E731

    def to(value, dims, dtype):
        if dtype == TensorType.of(value).dtype:
            return value
        return b.to_dtype(value, T(*dims, dtype=dtype))

    def round_bf16(value, dims):
        # f32 `value` rounded to the nearest bf16 (ties to even), still f32: the integer form of
        # arith.truncf, which IREE's CPU codegen cannot drop (see the module docstring); used on
        # the widened q only. Exact for every finite value and infinities; only a NaN with an
        # all-ones payload changes.
        i32 = lambda: T(*dims, dtype="si32")  # noqa: E731
        bits = b.op("torch.aten.view.dtype", [value, b.int(SCALAR_TYPE["si32"])], i32())
        lsb = b.op("torch.aten.bitwise_and.Scalar", [bits, b.int(1 << 16)], i32())
        lsb = b.op("torch.aten.floor_divide.Scalar", [lsb, b.int(1 << 16)], i32())  # 0 or 1
        bits = b.op("torch.aten.add.Scalar", [bits, b.int(0x7FFF), one], i32())
        bits = b.op("torch.aten.add.Tensor", [bits, lsb, one], i32())
        bits = b.op("torch.aten.bitwise_and.Scalar", [bits, b.int(-(1 << 16))], i32())
        return b.op("torch.aten.view.dtype", [bits, b.int(SCALAR_TYPE[f])], T(*dims))

    # Leading dims of per-query tensors: () in decode form, (S,) in prefill form.
    lead = () if decode else (S,)
    mm = "torch.aten.mm" if decode else "torch.aten.bmm"
    one, zero, last = b.int(1), b.int(0), b.int(-1)

    q = b.op("torch.aten.view", [site.q, b.ints([H, D])], T(H, D, dtype=io)) if decode else site.q
    q = to(q, (*lead, H, D), f)
    if io == "bf16":
        q = round_bf16(q, (*lead, H, D))
    idx = b.op("torch.aten.view", [site.idx, b.ints([K])], T(K, dtype=site.idx_dtype)) if decode else site.idx
    slot_dim = b.int(0 if decode else 1)
    step = block or tile
    bounds = [(lo, min(lo + step, K)) for lo in range(0, K, step)]
    if block:  # the cache as aligned blocks [T/block, block, D]
        blocks = b.op(
            "torch.aten.view",
            [site.kv, b.ints([-1, block, D])],
            T(None if site.T is None else site.T // block, block, D, dtype=io),
        )
    m = l = acc = None
    for lo, hi in bounds:
        tile = hi - lo
        # sel = idx[..., lo:hi]
        sel = idx
        if tile != K:
            sel = b.op(
                "torch.aten.slice.Tensor",
                [idx, slot_dim, b.int(lo), b.int(hi), one],
                T(*lead, tile, dtype=site.idx_dtype),
            )
        valid = b.op("torch.aten.ge.Scalar", [sel, zero], T(*lead, tile, dtype="i1"))
        if not decode:  # [S, t] -> [S, 1, t], broadcast over heads
            valid = b.op("torch.aten.unsqueeze", [valid, one], T(S, 1, tile, dtype="i1"))
        if block:
            # rows = blocks[clamp(max(sel), 0) // block][:tile]: one index per query and tile
            n = 1 if decode else S
            top = b.op("torch.aten.amax", [sel, b.ints([-1]), b.bool(True)], T(*lead, 1, dtype=site.idx_dtype))
            top = b.op("torch.aten.view", [top, b.ints([-1])], T(n, dtype=site.idx_dtype))
            top = b.op("torch.aten.clamp", [top, zero, b.none()], T(n, dtype=site.idx_dtype))
            pool = b.op("torch.aten.floor_divide.Scalar", [top, b.int(block)], T(n, dtype=site.idx_dtype))
            rows = b.op("torch.aten.index_select", [blocks, zero, pool], T(n, block, D, dtype=io))
            if tile != block:
                rows = b.op("torch.aten.slice.Tensor", [rows, one, zero, b.int(tile), one], T(n, tile, D, dtype=io))
            rows = to(rows, (n, tile, D), f)
            if decode:
                rows = b.op("torch.aten.view", [rows, b.ints([tile, D])], T(tile, D))
        else:
            # rows = kv[clamp(sel, 0)]: one index_select of the tile's flattened slots
            safe = b.op("torch.aten.clamp", [sel, zero, b.none()], T(*lead, tile, dtype=site.idx_dtype))
            flat_n = tile if decode else (None if S is None else S * tile)
            if not decode:
                safe = b.op("torch.aten.view", [safe, b.ints([-1])], T(flat_n, dtype=site.idx_dtype))
            rows = b.op("torch.aten.index_select", [site.kv, zero, safe], T(flat_n, D, dtype=io))
            rows = to(rows, (flat_n, D), f)
            if not decode:
                rows = b.op("torch.aten.view", [rows, b.ints([-1, tile, D])], T(S, tile, D))
        # s = where(valid, scale · q·rowsᵀ, NEG)
        rows_t = b.op("torch.aten.transpose.int", [rows, b.int(-2), last], T(*lead, D, tile))
        s = b.op(mm, [q, rows_t], T(*lead, H, tile))
        s = b.op("torch.aten.mul.Scalar", [s, b.float(site.scale)], T(*lead, H, tile))
        s = b.op("torch.aten.where.ScalarOther", [valid, s, b.float(_NEG)], T(*lead, H, tile))
        # m' = max(m, rowmax(s))
        m_new = b.op("torch.aten.amax", [s, b.ints([-1]), b.bool(True)], T(*lead, H, 1))
        if m is not None:
            m_new = b.op("torch.aten.maximum", [m, m_new], T(*lead, H, 1))
        # p = where(valid, exp(s - m'), 0)
        p = b.op("torch.aten.sub.Tensor", [s, m_new, one], T(*lead, H, tile))
        p = b.op("torch.aten.exp", [p], T(*lead, H, tile))
        p = b.op("torch.aten.where.ScalarOther", [valid, p, b.float(0.0)], T(*lead, H, tile))
        # Σp and p·v, v = rows[..., :V]
        p_sum = b.op("torch.aten.sum.dim_IntList", [p, b.ints([-1]), b.bool(True), b.none()], T(*lead, H, 1))
        v = rows
        if V != D:
            v = b.op("torch.aten.slice.Tensor", [rows, last, zero, b.int(V), one], T(*lead, tile, V))
        pv = b.op(mm, [p, v], T(*lead, H, V))
        if m is None:
            l, acc = p_sum, pv
        else:
            # alpha = exp(m - m'); l' = l·alpha + Σp; acc' = acc·alpha + p·v
            alpha = b.op("torch.aten.sub.Tensor", [m, m_new, one], T(*lead, H, 1))
            alpha = b.op("torch.aten.exp", [alpha], T(*lead, H, 1))
            l = b.op("torch.aten.mul.Tensor", [l, alpha], T(*lead, H, 1))
            l = b.op("torch.aten.add.Tensor", [l, p_sum, one], T(*lead, H, 1))
            acc = b.op("torch.aten.mul.Tensor", [acc, alpha], T(*lead, H, V))
            acc = b.op("torch.aten.add.Tensor", [acc, pv, one], T(*lead, H, V))
        m = m_new
    # out = acc / max(l, tiny)
    l = b.op("torch.aten.clamp", [l, b.float(_TINY), b.none()], T(*lead, H, 1))
    out = b.op("torch.aten.div.Tensor", [acc, l], T(*lead, H, V))
    if decode:
        out = b.op("torch.aten.view", [out, b.ints([1, H, V])], T(1, H, V))
    return out  # f32 whatever the io dtype (the op's contract)


@dataclass(frozen=True)
class DsaToGatherTiles(ModulePass):
    """Options:
    tile        slots per tile (default 64); must divide K. A tile >= K means one tile of K.
    decode-tile slots per tile in the decode form (S == 1); 0 (default) means `tile`.
    block       > 0: the selection is block-structured (glm5_next's k-pool indexer, block =
                kpool): slots j·block … (j+1)·block − 1 hold either -1 or pos·block + i for one
                block `pos` per query (a shorter last group likewise: the visible tail pool).
                Tiles are then those groups, each gathered as one aligned block of the cache
                (one index per query and tile instead of `block`); T must be a multiple of
                block (a dynamic T, a paged pool, is taken to be). Overrides tile and
                decode-tile. 0 (default): gather slot by slot.
    """

    name = "dsa-to-gather-tiles"
    option_minimums = {"block": 0, "tile": 1, "decode_tile": 0}
    tile: int = 64
    decode_tile: int = 0
    block: int = 0

    def tile_for(self, site: DsaAttentionSite) -> int:
        tile = self.decode_tile if site.S == 1 and self.decode_tile else self.tile
        return min(tile, site.K)

    def apply(self, module_op: Operation, diag: DiagnosticEngine) -> None:
        for site in collect_sites(
            module_op, lambda op: operator_name(op) == OP_NAME, match_dsa_attention, diag, self._refuse
        ):
            out = _rewrite(site, 0, self.block) if self.block else _rewrite(site, self.tile_for(site))
            replace_op(site.op, [out])

    def _refuse(self, site: DsaAttentionSite) -> str | None:
        """The options' preconditions: block divides T, or the tile divides K. A dynamic T is a
        paged pool of whole cache blocks, each a multiple of `block` rows (the compile driver
        refuses any other block size), so block divides it too."""
        if self.block:
            if site.T is not None and site.T % self.block:
                return f"dsa_attention: block={self.block} does not divide the {site.T} cache rows"
            return None
        tile = self.tile_for(site)
        if site.K % tile:
            option = "decode-tile" if site.S == 1 and self.decode_tile else "tile"
            return f"dsa_attention: {option}={tile} does not divide the {site.K} selected slots"
        return None
