"""torch.export of a model's entry points (`prefill`, `decode`, and `prefill_first` / `prefill_chunk`
where they apply; `encode_image` and `prefill_mm` for a model with a vision tower: see
export_model) into one raw torch-dialect module.

Weights never enter the IR: each parameter becomes
    %w = torch.operator "torch.day0.parameter"() {day0.key = "<checkpoint tensor name>"}
which the `parameters-to-globals` pass turns into an IREE parameter global read from the shards at
load time. The model can therefore be exported with uninitialized weights (no checkpoint load).
"""

import warnings
from dataclasses import dataclass

import torch
from torch import nn
from torch.export import Dim
from torch.export.graph_signature import InputKind
from torch_mlir import ir as tm_ir
from torch_mlir.dialects import torch as torch_d
from torch_mlir.extras.fx_decomp_util import get_decomposition_table
from torch_mlir.extras.fx_importer import FxImporter, FxImporterHooks

from day0.frontend import ops  # registers the day0:: ops before tracing
from day0.runtime.artifact import NON_FINITE_TOKEN, image_encoder

PARAMETER_OP = "torch.day0.parameter"


class _Prefill(nn.Module):
    """Every entry point also returns the greedy next token after its last position (chosen on
    the device, lowest id on ties, as runtime.sampling.greedy): greedy generation reads back 8
    bytes per call instead of the logits ([S, V] after a prompt). When that row holds a NaN or an
    infinity the token is NON_FINITE_TOKEN (-1), which the runtime reports instead of an argmax that
    would depend on how the device orders NaN (greedy_token: a top-1, and the row's sum · 0 == 0,
    which holds exactly when every value is finite, barring a sum past f32's range).

    The host checks ids and positions before a call; the step clamps them too (ids into the
    vocabulary, the written rows into the state's max_seq_len), so that no input, whatever the
    host lets through, makes a gather or a cache write leave its tensor."""

    first_turn = False

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids, start, *state):
        return self._step(ids, start, state, **({"first_turn": True} if self.first_turn else {}))

    def _step(self, ids, start, state, **step_options):
        """lm.step on the clamped ids and start, with `step_options`; (logits, next, *state)."""
        ids = ids.clamp(0, self.lm.cfg.vocab_size - 1)
        start = start.clamp(0, self.lm.max_seq_len - ids.shape[0])
        logits, *state = self.lm.step(ids, start, *state, **step_options)
        return (logits, greedy_token(logits, batched=False), *state)


class _Decode(_Prefill):
    """One token (S = 1)."""


class _PrefillImages(_Prefill):
    """A prompt with images (`prefill_mm`): (ids [S], start [1], features [N, hidden] f32,
    feature_rows [S] i64, *state) -> (logits, next, *state). Row s takes features[feature_rows[s]]
    instead of its token's embedding where feature_rows[s] >= 0 (CausalLM.mix_features, which
    clamps the rows into [-1, N - 1] in the traced graph)."""

    def forward(self, ids, start, features, feature_rows, *state):
        return self._step(ids, start, state, features=features, feature_rows=feature_rows)


class _EncodeImage(nn.Module):
    """The vision tower (`encode_image_<P>`): (pixel_values [P, patch_dim] f32, positions [P, 2]
    i64, segments [P] i64) -> features [P/m², hidden] f32, P a multiple of m² (models/vision.py).
    No gather or write depends on the inputs' values: positions only enter the rope's angles and
    segments only the attention mask."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, pixel_values, positions, segments):
        return self.lm.vision(pixel_values, positions, segments)


def _feature_inputs(lm, max_seq_len: int) -> tuple[tuple, Dim]:
    """The image inputs prefill_mm and paged_prefill_mm take beside a prompt (chunk) of 4 example
    tokens: (features [3, hidden], feature_rows [4]) examples, and N's dim: dynamic in
    [2, max_seq_len] (a call with one feature row passes a second, unused one)."""
    examples = (torch.zeros(3, lm.cfg.hidden_size), torch.full((4,), -1))
    return examples, Dim("feature_rows", min=2, max=max_seq_len)


def _image_wrappers(lm, max_seq_len: int, state: list, buckets: tuple[int, ...]) -> dict:
    """encode_image_<P> for each P of `buckets` (static patch counts: runtime/images.py
    image_buckets says why) and prefill_mm (S dynamic as prefill's; N, the feature rows, dynamic
    in [2, max_seq_len]: a call with one feature row passes a second, unused one)."""
    seq = Dim("seq", min=2, max=max_seq_len)
    features, rows = _feature_inputs(lm, max_seq_len)
    zeros = lambda *shape: torch.zeros(*shape, dtype=torch.int64)  # noqa: E731
    prompt = (zeros(4), zeros(1), *features, *state)
    encoders = {
        image_encoder(p): (_EncodeImage(lm), (torch.zeros(p, lm.vision.patch_dim()), zeros(p, 2), zeros(p)), None)
        for p in buckets
    }
    return {
        **encoders,
        "prefill_mm": (_PrefillImages(lm), prompt, ({0: seq}, None, {0: rows}, {0: seq}, (None,) * len(state))),
    }


class _PrefillFirst(_Prefill):
    """The first turn of a sequence (start == 0): the model may restrict keys to the prompt."""

    first_turn = True


class _PagedStep(nn.Module):
    """A step over paged state (models/paging.py, CausalLM.step_paged):
        (ids [S], positions [S], tables [G, nb], slots [G], prev [M], logits_out [R, V] (written),
         next_out [G] (written), *pools, *slot tensors) -> (*pools, *slot tensors)
    G = 1: a prompt chunk of one sequence, `next` the greedy token after its last row (`last`:
    R = 1, the logits of that row only; else R = S); G = S: a batched decode step, one token,
    table and slot per sequence, `next` per row. NON_FINITE_TOKEN where a row is not all finite.

    The step writes its logits and next tokens into the caller's buffers (`copy_` into inputs:
    torch.export records them as mutated inputs, which IREE's torch ABI aliases to the caller's
    buffers), so the compiled step allocates no result: with its transient memory also the
    caller's (`--iree-torch-externalize-transients`, lowering/targets.py) a call is one queue
    submission that never blocks the host, and the Engine can submit step N+1 while step N runs
    (runtime/engine.py). `prev` [M] (M: the largest compiled batch) is the next_out of an earlier
    step still on the device: an id < 0 stands for prev[-1 - id], a token the host has not read
    yet. Ids, positions, table entries and slots are clamped into range as in _Prefill; a pool
    holds whole blocks."""

    def __init__(self, lm, block: int, batched: bool, last: bool = False):
        super().__init__()
        self.lm, self.block, self.batched, self.last = lm, block, batched, last
        pools, _ = lm.paged_state(block)
        self.pools = len(pools)
        self.block_rows = pools[0].shape[0] if pools else 0  # the first pool's rows per block

    def forward(self, ids, positions, tables, slots, prev, logits_out, next_out, *state):
        return self._step(ids, positions, tables, slots, prev, logits_out, next_out, state)

    def _step(self, ids, positions, tables, slots, prev, logits_out, next_out, state, **step_options):
        ids = torch.where(ids < 0, prev[(-1 - ids).clamp(0, prev.shape[0] - 1)], ids)
        ids = ids.clamp(0, self.lm.cfg.vocab_size - 1)
        positions = positions.clamp(0, self.lm.max_seq_len - 1).clamp(max=tables.shape[1] * self.block - 1)
        if self.pools:
            tables = tables.clamp(0, state[0].shape[0] // self.block_rows - 1)
        if len(state) > self.pools:  # slot tensors follow the pools
            slots = slots.clamp(0, state[self.pools].shape[0] - 1)
        logits, *state = self.lm.step_paged(
            ids,
            positions,
            tables,
            slots,
            *state,
            block=self.block,
            batched=self.batched,
            last=self.last,
            **step_options,
        )
        logits_out.copy_(logits)
        next_out.copy_(greedy_token(logits, self.batched))
        return tuple(state)


class _PagedImageStep(_PagedStep):
    """A prompt chunk with images over paged state (`paged_prefill_mm`): _PagedStep's arguments
    with features [N, hidden] f32 and feature_rows [S] i64 after next_out, as prefill_mm's
    (_PrefillImages): the Engine passes every chunk of a prompt the same features and its own
    slice of the prompt's feature rows."""

    def __init__(self, lm, block: int):
        super().__init__(lm, block, batched=False)

    def forward(self, ids, positions, tables, slots, prev, logits_out, next_out, features, feature_rows, *state):
        mm = {"features": features, "feature_rows": feature_rows}
        return self._step(ids, positions, tables, slots, prev, logits_out, next_out, state, **mm)


def greedy_token(logits, batched: bool):
    """The greedy token of the last row ([1]) or, batched, of every row ([S]): the lowest id
    holding the row's max (a top-1 per row: aten.topk, lowered as every top-k, keeps the lowest
    id among equals), NON_FINITE_TOKEN where the row is not all finite (_Prefill).
    Not aten.argmax: IREE 3.13's CUDA codegen fails to distribute it over the rows of a [B, V]
    (or a slice logits[-1:]), and the 1-D argmax of logits[-1] it does compile returned a wrong
    id now and then on the H200 (2 of 540 probe steps; 0 of 540 for the top-1: docs/perf.md)."""
    rows = logits if batched else logits[-1:]
    best = rows.topk(1, dim=-1, sorted=False).indices[:, 0]
    finite = _row_sums(rows) * 0 == 0
    return torch.where(finite, best, torch.full_like(best, NON_FINITE_TOKEN))


def _row_sums(rows, lanes: int = 128):
    """The sum of each row of [B, V], in two steps: the row padded with zeros to a multiple of
    `lanes`, summed per lane group, then across groups. One `sum(-1)` over [64, 32000] fused with
    the lm_head's output into a fully unrolled 11 MB PTX kernel (IREE 3.13, cuda-sm90: the driver
    did not finish loading the module in minutes; docs/perf.md); the two-step form compiles to an
    ordinary reduction."""
    padded = torch.nn.functional.pad(rows, (0, -rows.shape[-1] % lanes))
    return padded.view(rows.shape[0], -1, lanes).sum(-1).sum(-1)


@dataclass(frozen=True)
class PagedExport:
    """The paged entry points to export: `paged_prefill` (one sequence's prompt chunk, S dynamic),
    with `chunk` > 0 `paged_prefill_chunk` (S = chunk, static, the last row's logits only: IREE
    compiles a static row count's matmuls for the tensor cores, a dynamic one's as matvecs), and
    `paged_decode_<B>` for each batch size B; pools of whole `block`-position blocks, their count
    dynamic (chosen at load). With `images` (a model with a vision tower, export_model's images)
    also `paged_prefill_mm` (_PagedImageStep: a chunk of a prompt with images, S dynamic)."""

    block: int
    batch_sizes: tuple[int, ...]
    chunk: int = 0
    images: bool = False


def paged_entry_points(paged: PagedExport | None) -> list[str]:
    if paged is None:
        return []
    static = ["paged_prefill_chunk"] if paged.chunk else []
    images = ["paged_prefill_mm"] if paged.images else []
    return ["paged_prefill", *static, *images] + [f"paged_decode_{b}" for b in paged.batch_sizes]


def _paged_wrappers(lm, max_seq_len: int, paged: PagedExport) -> dict:
    """The paged entry points' modules with example arguments and dynamic dims: pools of a
    dynamic block count (every pool the same count), slot tensors of a dynamic slot count."""
    pools, slots = lm.paged_state(paged.block)
    examples = [torch.zeros(2 * p.shape[0], *p.shape[1:], dtype=getattr(torch, p.dtype)) for p in pools]
    examples += [torch.zeros(2, *s.shape, dtype=getattr(torch, s.dtype)) for s in slots]
    # a table's length; at least 2 as its example (a sequence of one block passes a table of 1:
    # torch.export takes no dim whose range is a single value)
    blocks = Dim("blocks", min=1, max=max(2, -(-max_seq_len // paged.block)))
    pool_blocks, slot_count = Dim("pool_blocks", min=2), Dim("slots", min=2)
    state_shapes = tuple({0: p.shape[0] * pool_blocks} for p in pools) + tuple({0: slot_count} for _ in slots)
    seq = Dim("seq", min=2, max=max_seq_len)
    zeros = lambda *shape: torch.zeros(*shape, dtype=torch.int64)  # noqa: E731
    vocab, prev = lm.cfg.vocab_size, zeros(max(paged.batch_sizes))
    wrappers = {
        "paged_prefill": (
            _PagedStep(lm, paged.block, batched=False),
            (zeros(4), zeros(4), zeros(1, 2), zeros(1), prev, torch.zeros(4, vocab), zeros(1), *examples),
            ({0: seq}, {0: seq}, {1: blocks}, None, None, {0: seq}, None, state_shapes),
        )
    }
    if paged.chunk:
        c = paged.chunk
        wrappers["paged_prefill_chunk"] = (
            _PagedStep(lm, paged.block, batched=False, last=True),
            (zeros(c), zeros(c), zeros(1, 2), zeros(1), prev, torch.zeros(1, vocab), zeros(1), *examples),
            (None, None, {1: blocks}, None, None, None, None, state_shapes),
        )
    if paged.images:
        features, rows = _feature_inputs(lm, max_seq_len)
        wrappers["paged_prefill_mm"] = (
            _PagedImageStep(lm, paged.block),
            (zeros(4), zeros(4), zeros(1, 2), zeros(1), prev, torch.zeros(4, vocab), zeros(1), *features, *examples),
            ({0: seq}, {0: seq}, {1: blocks}, None, None, {0: seq}, None, {0: rows}, {0: seq}, state_shapes),
        )
    for b in paged.batch_sizes:
        wrappers[f"paged_decode_{b}"] = (
            _PagedStep(lm, paged.block, batched=True),
            (zeros(b), zeros(b), zeros(b, 2), zeros(b), prev, torch.zeros(b, vocab), zeros(b), *examples),
            (None, None, {1: blocks}, None, None, None, None, state_shapes),
        )
    return wrappers


class _ParametersAsOps(FxImporterHooks):
    """Imports every parameter as a `torch.day0.parameter` op naming its checkpoint tensor."""

    def resolve_input(self, gni, value, info):
        if info.input_spec.kind != InputKind.PARAMETER:
            return None  # buffers (rope tables) are small literals
        key = info.input_spec.target.removeprefix("lm.")
        op = tm_ir.Operation.create(
            "torch.operator",
            results=[info.ir_type],
            attributes={"name": tm_ir.StringAttr.get(PARAMETER_OP), "day0.key": tm_ir.StringAttr.get(key)},
        )
        return op.result


@dataclass
class ExportedModule:
    mlir: str  # raw torch dialect: one function per name of entry_points (@prefill, @decode, ...)
    parameters: list[str]  # checkpoint tensor names the module reads


def takes_images(lm: nn.Module) -> bool:
    """Whether the model holds a vision tower whose features its steps take (glm5_next with a
    vision_config: models/glm5_next.py)."""
    return lm.takes_image_features and getattr(lm, "vision", None) is not None


def entry_points(lm: nn.Module, prefill_chunk: int = 0, images: tuple[int, ...] = ()) -> list[str]:
    """The functions export_model emits for this model (a models.base.CausalLM; prefill_chunk,
    images: see export_model)."""
    encoders = [image_encoder(p) for p in images] if takes_images(lm) else []
    return (
        ["prefill", "decode"]
        + (["prefill_first"] if lm.has_first_turn else [])
        + (["prefill_chunk"] if prefill_chunk else [])
        + (encoders + ["prefill_mm"] if encoders else [])
    )


DECOMPOSABLE = ops.DECOMPOSABLE  # day0 ops a target may keep whole (ops.keeping)


def export_model(
    lm: nn.Module,
    max_seq_len: int,
    keep: tuple[str, ...] = (),
    prefill_chunk: int = 0,
    paged: PagedExport | None = None,
    images: tuple[int, ...] = (),
) -> ExportedModule:
    """Export `lm.step` as prefill (S in [2, max_seq_len], dynamic), decode (S = 1) and, for
    models with a first-turn form, prefill_first (start == 0, dynamic S); with prefill_chunk > 0
    also prefill_chunk (S = prefill_chunk, static); with `paged`, `lm.step_paged` as the paged
    entry points (PagedExport). A model with a vision tower (takes_images), given `images` (patch
    counts: runtime/images.py image_buckets), also gets `encode_image_<P>` for each P of them (the
    tower: pixel_values [P, patch_dim], positions [P, 2], segments [P] -> features [P/m², hidden];
    P static, a multiple of m²) and
    `prefill_mm` (ids [S], start [1], features [N, hidden], feature_rows [S], *state -> logits,
    next, *state; S in [2, max_seq_len], N in [2, max_seq_len]). `keep`: names of DECOMPOSABLE day0 ops to leave
    as `torch.operator` for the target's passes (the others are traced as their reference aten
    body)."""
    state = lm.empty_state()
    start = torch.zeros(1, dtype=torch.int64)
    seq = Dim("seq", min=2, max=max_seq_len)
    prompt = (torch.zeros(4, dtype=torch.int64), start, *state)
    dynamic = ({0: seq}, None, (None,) * len(state))
    wrappers = {
        "prefill": (_Prefill, prompt, dynamic),
        "decode": (_Decode, (torch.zeros(1, dtype=torch.int64), start, *state), None),
        "prefill_first": (_PrefillFirst, prompt, dynamic),
        "prefill_chunk": (_Prefill, (torch.zeros(max(prefill_chunk, 1), dtype=torch.int64), start, *state), None),
    }
    decompositions = get_decomposition_table()  # the aten decompositions torch-mlir expects
    context = tm_ir.Context()
    torch_d.register_dialect(context)
    importer = FxImporter(context=context, hooks=_ParametersAsOps())
    modules = {name: (wrapper(lm), args, shapes) for name, (wrapper, args, shapes) in wrappers.items()}
    if paged is not None:
        modules.update(_paged_wrappers(lm, max_seq_len, paged))
    if images and takes_images(lm):
        modules.update(_image_wrappers(lm, max_seq_len, state, images))
    params: set[str] = set()
    for name in entry_points(lm, prefill_chunk, images) + paged_entry_points(paged):
        module, args, shapes = modules[name]
        with warnings.catch_warnings():
            # torch's own pytree code trips its LeafSpec deprecation while exporting: not ours to fix
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
            with ops.keeping(keep):
                program = torch.export.export(module, args, dynamic_shapes=shapes, strict=False)
            program = program.run_decompositions(decompositions)
        before = _function_names(importer.module_op)
        importer.import_program(program, func_name=name)
        _own_private_functions(importer.module_op, name, before)
        params |= {
            s.target.removeprefix("lm.") for s in program.graph_signature.input_specs if s.kind == InputKind.PARAMETER
        }
    _reflect_signatures(importer.module_op, max_seq_len)
    return ExportedModule(mlir=str(importer.module_op), parameters=sorted(params))


def _functions(module_op) -> list:
    return [op for op in module_op.regions[0].blocks[0].operations if op.operation.name == "func.func"]


def _function_names(module_op) -> set[str]:
    return {tm_ir.StringAttr(op.attributes["sym_name"]).value for op in _functions(module_op)}


def _own_private_functions(module_op, entry: str, before: set[str]) -> None:
    """Prefix the functions an entry point's import added beside it (torch.while_loop's cond and
    body graphs, named `while_loop_body_graph_0` in every program) with the entry's name, so that
    the next entry point's import cannot add a second function of the same name."""
    with module_op.context:
        for op in _functions(module_op):
            sym = tm_ir.StringAttr(op.attributes["sym_name"]).value
            if sym != entry and sym not in before:
                new = f"{entry}__{sym}"
                tm_ir.SymbolTable.replace_all_symbol_uses(sym, new, module_op)
                tm_ir.SymbolTable.set_symbol_name(op, new)


def _reflect_signatures(module_op, max_seq_len: int) -> None:
    """Record each entry point's own signature (its torch types) and max_seq_len in the function's
    `iree.reflection`, which IREE keeps in the vmfb: the runtime checks the manifest against them
    at load (runtime/artifact.py, check_signatures), so an edited manifest cannot drive the step
    past its compiled shapes."""
    with module_op.context:
        for op in _functions(module_op):
            fields = {
                "day0.entry": tm_ir.StringAttr(op.attributes["sym_name"]).value,
                "day0.signature": str(tm_ir.TypeAttr(op.attributes["function_type"]).value),
                "day0.max_seq_len": str(max_seq_len),
            }
            op.attributes["iree.reflection"] = tm_ir.DictAttr.get(
                {k: tm_ir.StringAttr.get(v) for k, v in fields.items()}
            )
