"""Checkpoint reader: real safetensors files, and one error test per failure mode, each checking
that the message names the file / tensor / field concerned."""

import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from day0.models.checkpoint import Checkpoint, CheckpointError, read_shard_header, verify_file_records


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(16, 8, generator=g),
        "layer.0.attn.wq": torch.randn(8, 8, generator=g).to(torch.bfloat16),
        "layer.0.norm": torch.randn(8, generator=g).to(torch.float16),
        "layer.0.experts.blocks": torch.randint(0, 255, (4, 8, 16), dtype=torch.uint8, generator=g),
        "step": torch.tensor([3], dtype=torch.int64),
    }


def _write_config(d, text=None):
    (d / "config.json").write_text(text if text is not None else json.dumps({"model_type": "t"}))


@pytest.fixture
def single(tmp_path):
    """One shard, no index."""
    _write_config(tmp_path)
    save_file(_tensors(), tmp_path / "model.safetensors", metadata={"format": "pt"})
    return tmp_path


@pytest.fixture
def sharded(tmp_path):
    """Two shards and an index in the exact format transformers writes."""
    _write_config(tmp_path)
    t = _tensors()
    names = sorted(t)
    split = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
    weight_map = {}
    for fname, ns in split.items():
        save_file({n: t[n] for n in ns}, tmp_path / fname, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(ns, fname))
    total = sum(x.numel() * x.element_size() for x in t.values())
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    return tmp_path


def _reference(files):
    """name -> (shape, dtype) as the safetensors library itself reports them."""
    out = {}
    for f in files:
        with safe_open(str(f), "pt") as s:
            for n in s.keys():
                sl = s.get_slice(n)
                out[n] = (tuple(sl.get_shape()), sl.get_dtype())
    return out


@pytest.mark.parametrize("layout", ["single", "sharded"])
def test_headers_match_safetensors(layout, request):
    d = request.getfixturevalue(layout)
    ckpt = Checkpoint.open(d)
    assert ckpt.config == {"model_type": "t"} and ckpt.dir == d
    assert ckpt.files == sorted(d.glob("*.safetensors"))
    assert {n: (i.shape, i.dtype) for n, i in ckpt.tensors.items()} == _reference(ckpt.files)
    ref = _tensors()
    for n, info in ckpt.tensors.items():
        assert ckpt.torch_dtype(n) == ref[n].dtype
        # the absolute offsets address exactly the tensor's bytes
        with open(info.file, "rb") as f:
            f.seek(info.data_offsets[0])
            raw = f.read(info.nbytes)
        assert raw == ref[n].contiguous().view(torch.uint8).numpy().tobytes()


def test_transformers_save_pretrained_many_shards(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.DeepseekV32Config(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        head_dim=8,
        n_routed_experts=4,
        n_group=1,
        topk_group=1,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        intermediate_size=32,
        index_n_heads=4,
        index_head_dim=16,
        index_topk=4,
        first_k_dense_replace=1,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path, max_shard_size="20KB")
    ckpt = Checkpoint.open(tmp_path)
    assert len(ckpt.files) > 2
    assert ckpt.config["kv_lora_rank"] == 16
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(ckpt.tensors) == set(index["weight_map"])
    assert {n: (i.shape, i.dtype) for n, i in ckpt.tensors.items()} == _reference(ckpt.files)
    expected = {n: (i.shape, {i.dtype}) for n, i in ckpt.tensors.items()}
    ckpt.check_expected(expected)
    dest = {n: torch.zeros(i.shape, dtype=ckpt.torch_dtype(n)) for n, i in ckpt.tensors.items()}
    ckpt.load_into(dest)
    for f in ckpt.files:
        with safe_open(str(f), "pt") as s:
            for n in s.keys():
                assert torch.equal(dest[n], s.get_tensor(n))


def test_load_into_round_trip_and_cast(sharded):
    ckpt = Checkpoint.open(sharded)
    ref = _tensors()
    dest = {n: torch.empty_like(t) for n, t in ref.items()}
    dest["layer.0.attn.wq"] = torch.empty(8, 8, dtype=torch.float32)  # bf16 -> f32 cast
    ckpt.load_into(dest)
    for n, t in ref.items():
        assert torch.equal(dest[n], t.to(dest[n].dtype)), n


def test_load_into_shape_mismatch(single):
    ckpt = Checkpoint.open(single)
    with pytest.raises(CheckpointError, match=r"embed\.weight.*\(16, 8\).*\(8, 16\)"):
        ckpt.load_into({"embed.weight": torch.empty(8, 16)})


def test_load_into_missing(single):
    with pytest.raises(CheckpointError, match="missing tensor lm_head.weight"):
        Checkpoint.open(single).load_into({"lm_head.weight": torch.empty(1)})


def test_missing_config(tmp_path):
    save_file(_tensors(), tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="no config.json") as e:
        Checkpoint.open(tmp_path)
    assert str(tmp_path) in str(e.value)


def test_not_a_directory(tmp_path):
    with pytest.raises(CheckpointError, match="nope.*not a directory"):
        Checkpoint.open(tmp_path / "nope")


def test_bad_config_json(tmp_path):
    _write_config(tmp_path, '{\n  "hidden_size": 32,\n  "vocab_size": \n}')
    save_file(_tensors(), tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"config\.json is not valid JSON.*line 4") as e:
        Checkpoint.open(tmp_path)
    assert str(tmp_path / "config.json") in str(e.value)


def test_no_shards(tmp_path):
    _write_config(tmp_path)
    with pytest.raises(
        CheckpointError,
        match=r"no model\.safetensors\.index\.json and no "
        r"\*\.safetensors",
    ):
        Checkpoint.open(tmp_path)


def test_index_points_to_missing_shard(sharded):
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model-00002-of-00002\.safetensors.*does not exist"):
        Checkpoint.open(sharded)


def test_index_lists_tensor_absent_from_shard(sharded):
    p = sharded / "model.safetensors.index.json"
    index = json.loads(p.read_text())
    index["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors"
    p.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"ghost\.weight.*model-00001-of-00002.*lacks it"):
        Checkpoint.open(sharded)


def test_truncated_shard(single):
    f = single / "model.safetensors"
    size = f.stat().st_size
    # the tensor whose bytes end the file is the one that no longer fits
    last = max(read_shard_header(f).values(), key=lambda i: i.data_offsets[1])
    with open(f, "r+b") as fh:
        fh.truncate(size - 5)
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(single)
    assert str(e.value) == (
        f"truncated shard {f}: tensor {last.name} needs bytes up to {size} but the file has {size - 5}"
    )


def test_header_length_past_end(single):
    f = single / "model.safetensors"
    f.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(
        CheckpointError,
        match=r"model\.safetensors: header length 1000000000 is "
        r"larger than the file \(10 bytes\)",
    ):
        Checkpoint.open(single)


def test_header_garbage(single):
    f = single / "model.safetensors"
    f.write_bytes(struct.pack("<Q", 16) + b"\x00garbage!{[}]\xff\xfe" + b"\x00" * 32)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: header is not valid JSON"):
        Checkpoint.open(single)


def _rewrite_header(f, edit):
    """Replace a shard's header by edit(header), keeping the data bytes."""
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    edit(header)
    new = json.dumps(header).encode()
    f.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])


def test_byte_size_inconsistent_with_shape(single):
    f = single / "model.safetensors"
    _rewrite_header(f, lambda h: h["embed.weight"].update(shape=[16, 7]))
    with pytest.raises(
        CheckpointError,
        match=r"tensor embed\.weight: holds 512 bytes but dtype "
        r"F32 x shape \(16, 7\) needs 448",
    ):
        Checkpoint.open(single)


def test_bad_header_field(single):
    _rewrite_header(single / "model.safetensors", lambda h: h["step"].update(dtype="Q7"))
    with pytest.raises(CheckpointError, match=r"tensor step: unknown or missing field 'dtype'"):
        Checkpoint.open(single)


def _same_size_pair(header):
    """Two tensors of one byte size (layer.0.attn.wq and layer.0.norm differ; embed and blocks don't)."""
    sizes = {}
    for name, e in header.items():
        if name != "__metadata__":
            sizes.setdefault(e["data_offsets"][1] - e["data_offsets"][0], []).append(name)
    return next(names for names in sizes.values() if len(names) >= 2)[:2]


def test_overlapping_tensors_refused_as_the_reference_reader_does(single):
    """Two tensors on the same bytes (a header pointing a second name at the first's data) would
    load and generate; safetensors refuses it, and so does day0, naming the tensor."""
    f = single / "model.safetensors"

    def alias(h):
        a, b = _same_size_pair(h)
        h[b]["data_offsets"] = h[a]["data_offsets"]
        h[b]["dtype"], h[b]["shape"] = h[a]["dtype"], h[a]["shape"]

    _rewrite_header(f, alias)
    with pytest.raises(Exception, match="offset|Offset|InvalidOffset"):  # the reference reader
        safe_open(str(f), "pt")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor .*overlaps the tensor before it"):
        Checkpoint.open(single)


def test_hole_and_trailing_bytes_refused(single):
    f = single / "model.safetensors"
    raw = f.read_bytes()
    f.write_bytes(raw + b"\0" * 8)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: 8 bytes after the last tensor's data"):
        Checkpoint.open(single)
    f.write_bytes(raw)

    def drop_first(h):  # the first tensor's bytes stay in the file, named by no one: a hole
        h.pop(min((n for n in h if n != "__metadata__"), key=lambda n: h[n]["data_offsets"][0]))

    _rewrite_header(f, drop_first)
    with pytest.raises(CheckpointError, match=r"leaves a hole of \d+ bytes before it"):
        Checkpoint.open(single)


def test_tensor_in_two_shards(single):
    save_file({"step": torch.tensor([1])}, single / "extra.safetensors")
    with pytest.raises(
        CheckpointError,
        match=r"tensor step is in two shards: .*extra\.safetensors"
        r" and .*model\.safetensors",
    ):
        Checkpoint.open(single)


def _expected():
    return {n: (tuple(t.shape), None) for n, t in _tensors().items()}


def test_check_expected_ok_and_allow_unused(single):
    ckpt = Checkpoint.open(single)
    ckpt.check_expected(_expected())
    exp = _expected()
    del exp["step"], exp["layer.0.experts.blocks"]
    ckpt.check_expected(exp, allow_unused=["step", r"layer\.\d+\.experts\..*"])  # glob + regex


def test_check_expected_wrong_shape(single):
    exp = _expected()
    exp["layer.0.attn.wq"] = ((8, 4), {"BF16"})
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(single).check_expected(exp)
    assert (f"tensor layer.0.attn.wq in {single / 'model.safetensors'} has shape (8, 8), expected (8, 4)") in str(
        e.value
    )


def test_check_expected_wrong_dtype(single):
    exp = _expected()
    exp["layer.0.norm"] = ((8,), {"F32", "BF16"})
    with pytest.raises(
        CheckpointError,
        match=r"tensor layer\.0\.norm in .* has dtype F16, "
        r"expected one of \['BF16', 'F32'\]",
    ):
        Checkpoint.open(single).check_expected(exp)


def test_check_expected_missing(single):
    exp = _expected()
    exp["lm_head.weight"] = ((16, 8), None)
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(single).check_expected(exp)
    assert f"missing tensor lm_head.weight (expected shape (16, 8)) in checkpoint {single}" in str(e.value)


def test_check_expected_unexpected(single):
    save_file({f"mtp.{i}.w": torch.zeros(1) for i in range(7)}, single / "mtp.safetensors")
    with pytest.raises(
        CheckpointError,
        match=r"7 unexpected tensors .*: mtp\.0\.w, mtp\.1\.w, "
        r"mtp\.2\.w, mtp\.3\.w, mtp\.4\.w, \.\.\. \(2 more\)",
    ):
        Checkpoint.open(single).check_expected(_expected())
    Checkpoint.open(single).check_expected(_expected(), allow_unused=["mtp.*"])


def test_file_records_and_verify(sharded):
    ckpt = Checkpoint.open(sharded)
    records = ckpt.file_records()
    assert [r["path"] for r in records] == [f.name for f in ckpt.files]
    assert all(r["size"] == f.stat().st_size for r, f in zip(records, ckpt.files))
    verify_file_records(records, sharded)
    verify_file_records(ckpt.file_records(relative=False), "/nonexistent-base")  # absolute paths


def test_verify_detects_content_change(sharded):
    records = Checkpoint.open(sharded).file_records()
    f = sharded / "model-00002-of-00002.safetensors"
    raw = bytearray(f.read_bytes())
    raw[-1] ^= 0xFF  # same size, different bytes
    f.write_bytes(bytes(raw))
    with pytest.raises(
        CheckpointError,
        match=r"model-00002-of-00002\.safetensors changed after "
        r"compile: sha256",
    ):
        verify_file_records(records, sharded)


def test_verify_detects_size_change(sharded):
    records = Checkpoint.open(sharded).file_records()
    f = sharded / "model-00001-of-00002.safetensors"
    size = f.stat().st_size
    with open(f, "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(
        CheckpointError,
        match=rf"model-00001-of-00002\.safetensors changed after "
        rf"compile: size is {size + 1}, recorded {size}",
    ):
        verify_file_records(records, sharded)


def test_verify_detects_missing_file(sharded):
    records = Checkpoint.open(sharded).file_records()
    (sharded / "model-00001-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model-00001-of-00002\.safetensors is missing"):
        verify_file_records(records, sharded)
