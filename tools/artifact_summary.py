"""`day0 inspect`: what a person wants to know about an artifact, from its manifest.

summary_text(dir, manifest)  the readable form (default)
summary_json(manifest)       the same facts as JSON (`--json`), for scripts
"""

from pathlib import Path

from day0.runtime.memory_plan import memory_plan, size

# config.json fields that say how big a model is, shown when the checkpoint has them
_SIZE_FIELDS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "n_routed_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "vocab_size",
)


def summary_json(m, memory: int | None = None) -> dict:
    """The manifest's facts (runtime.artifact.Manifest) as a JSON-able dict; `vision` only for an
    artifact with a vision tower; `memory`: the paged state's plan (runtime/memory_plan.py), with
    what fits in `memory` bytes when given."""
    out = {
        "architecture": m.architecture,
        "target": m.target,
        "devices": list(m.devices),
        "device_count": m.device_count,
        # the checkpoint tensors' bytes each device reads; [] for one device (parameters.bytes,
        # the shards' file sizes, is what it holds)
        "device_bytes": list(m.device_bytes),
        "max_seq_len": m.max_seq_len,
        "vocab_size": m.vocab_size,
        "entry_points": {
            name: {
                "inputs": list(e.inputs),
                "outputs": list(e.outputs),
                "min_len": e.min_len,
                "static_len": e.static_len,
            }
            for name, e in m.entry_points.items()
        },
        "state": {s.name: list(s.shape) for s in m.state},
        "state_bytes": m.state_bytes(),
        "paged": None
        if m.paged is None
        else {
            "block_size": m.paged.block_size,
            "max_blocks": m.paged.max_blocks,
            "batch_sizes": list(m.paged.batch_sizes),
            "block_bytes": m.paged.block_bytes,
            "slot_bytes": m.paged.slot_bytes,
            "memory": memory_plan(m.paged, m.max_seq_len).to_json(memory),
        },
        "parameters": {
            "base_dir": m.parameters.base_dir,
            "count": m.parameters.count,
            "files": [f.path for f in m.parameters.files],
            "bytes": m.parameters.nbytes,
        },
        "compile_flags": list(m.compile_flags),
        "tools": m.tools,
    }
    if m.vision is not None:
        v = m.vision
        out["vision"] = {
            "image_token_id": v.image_token_id,
            "patch_dim": v.patch_dim,
            "merge_size": v.merge_size,
            "max_patches": v.max_patches,
            "buckets": list(v.buckets),
            "image_config": v.image_config,
        }
    return out


def _entry(name: str, e) -> str:
    if e.static_len:
        return f"{name} (exactly {e.static_len} tokens)"
    if e.min_len > 1:
        return f"{name} (>= {e.min_len} tokens)"
    return f"{name} (1 token)" if name == "decode" else name


def summary_text(artifact_dir: Path, m, memory: int | None = None) -> str:
    """The manifest (runtime.artifact.Manifest) of the artifact at artifact_dir, for reading;
    `memory`: a device budget in bytes the paged state's plan is shown against."""
    shape = ", ".join(f"{k} {m.config[k]}" for k in _SIZE_FIELDS if k in m.config)
    lines = [
        f"artifact      {artifact_dir} (format {m.format_version})",
        f"architecture  {m.architecture}" + (f" ({shape})" if shape else ""),
        f"target        {m.target}, runs on {', '.join(m.devices)}",
        f"max_seq_len   {m.max_seq_len}",
        f"parameters    {m.parameters.count} tensors, {size(m.parameters.nbytes)} in "
        f"{len(m.parameters.files)} file(s) under {m.parameters.base_dir}",
    ]
    lines += [f"                {f.path}  {size(f.size)}" for f in m.parameters.files]
    if m.device_bytes:
        lines.append(
            f"devices       {m.device_count}, routed experts split among them; parameters a device: "
            + ", ".join(f"{d}: {size(b)}" for d, b in enumerate(m.device_bytes))
        )
    lines.append(f"entry points  {', '.join(_entry(n, e) for n, e in m.entry_points.items())}")
    by_kind: dict[str, list] = {}
    for s in m.state:
        by_kind.setdefault(s.kind, []).append(s)
    total = sum(s.nbytes for s in m.state)
    lines.append(f"state         {size(total)} on the device for one sequence of up to {m.max_seq_len} tokens")
    for kind, specs in by_kind.items():
        dtypes = "/".join(sorted({s.dtype for s in specs}))
        shapes = sorted({"x".join(map(str, s.shape)) for s in specs})
        lines.append(
            f"                {kind:<14} {len(specs):>3} x [{', '.join(shapes)}] {dtypes:<9} "
            f"{size(sum(s.nbytes for s in specs))}"
        )
    if m.paged is not None:
        pg = m.paged
        lines.append(
            f"paged         blocks of {pg.block_size} positions, {size(pg.block_bytes)} each across "
            f"{len(pg.pools)} pools (up to {pg.max_blocks} a sequence); batched decode for "
            f"{', '.join(map(str, pg.batch_sizes))} sequences"
            + (
                f"; {size(pg.slot_bytes)} of recurrent state a sequence in {len(pg.slots)} slot tensors"
                if pg.slots
                else ""
            )
        )
        plan = memory_plan(pg, m.max_seq_len).lines(memory)
        lines += [f"{'memory' if i == 0 else '':<14}{line}" for i, line in enumerate(plan)]
        if memory is None:
            lines.append(f"{'':<14}(--memory SIZE, e.g. 80GiB: how many sequences and how long a context fit)")
    if m.vision is not None:
        v = m.vision
        lines.append(
            f"images        vision tower: patches of {v.patch_dim} values, {v.merge_size}x{v.merge_size} a token "
            f"(image token {v.image_token_id}), up to {v.max_patches} patches an image, encoded at "
            f"{', '.join(str(b // v.merge_size**2) for b in v.buckets)} tokens; image processor "
            f"{v.image_config or 'defaults (no preprocessor_config.json)'}"
        )
    lines.append(f"compile flags {' '.join(m.compile_flags)}")
    lines.append(f"tools         {', '.join(f'{k} {v}' for k, v in m.tools.items())}")
    return "\n".join(lines)
