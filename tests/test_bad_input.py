"""Bad input gets a clear error naming the problem: checkpoints, configs, prompts, sampling values,
artifacts. Each test asserts the message names the file, tensor, field or limit."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from day0.lowering.driver import BuildOptions, compile_checkpoint
from day0.models.checkpoint import CheckpointError
from day0.models.config import ConfigError
from day0.runtime.artifact import ArtifactError
from day0.runtime.session import Session, SessionError


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _single_shard(path: Path) -> Path:
    return next(path.glob("*.safetensors"))


def _rewrite_tensor(ckpt: Path, name: str, change) -> None:
    """Apply change(tensors) to the shard holding `name` (change may add/remove/replace)."""
    from day0.models.checkpoint import Checkpoint

    shard = Checkpoint.open(ckpt).info(name).file
    tensors = load_file(shard)
    change(tensors)
    save_file(tensors, shard, metadata={"format": "pt"})


def _compile(ckpt: Path, out: Path):
    return compile_checkpoint(ckpt, out, BuildOptions(max_seq_len=32), progress=lambda *a: None)


def test_missing_shard(checkpoint, tmp_path):
    ckpt = _copy(checkpoint("ds-sharded"), tmp_path / "ckpt")
    victim = sorted(ckpt.glob("*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(CheckpointError, match=victim.name):
        _compile(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_truncated_shard(checkpoint, tmp_path):
    ckpt = _copy(checkpoint("ds-sparse"), tmp_path / "ckpt")
    shard = _single_shard(ckpt)
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match=rf"truncated.*{shard.name}"):
        _compile(ckpt, tmp_path / "out")


def test_tensor_with_wrong_shape(checkpoint, tmp_path):
    ckpt = _copy(checkpoint("ds-sparse"), tmp_path / "ckpt")
    name = "model.layers.0.self_attn.q_a_proj.weight"
    _rewrite_tensor(ckpt, name, lambda t: t.update({name: torch.zeros(3, 5)}))
    with pytest.raises(CheckpointError, match=rf"{name}.*\(3, 5\)"):
        _compile(ckpt, tmp_path / "out")


def test_missing_tensor(checkpoint, tmp_path):
    ckpt = _copy(checkpoint("ds-sparse"), tmp_path / "ckpt")
    name = "model.layers.1.mlp.experts.3.down_proj.weight"
    _rewrite_tensor(ckpt, name, lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=r"missing tensor model\.layers\.1\.mlp\.experts\.3\.down_proj"):
        _compile(ckpt, tmp_path / "out")


@pytest.mark.parametrize(
    "change, field",
    [
        ({"model_type": "llama4"}, "model_type"),
        ({"model_type": None}, "model_type"),
        (
            {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
            "rope_parameters.rope_type",
        ),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"n_group": 3}, "n_group"),
        ({"layer_types": ["indexed_attention", "sliding_attention"]}, "layer_types"),
    ],
)
def test_unsupported_config(checkpoint, tmp_path, change, field):
    ckpt = _copy(checkpoint("ds-sparse"), tmp_path / "ckpt")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(change)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=rf"field '{field}'"):
        _compile(ckpt, tmp_path / "out")


def test_cli_reports_one_line_without_traceback(checkpoint, tmp_path):
    ckpt = _copy(checkpoint("ds-sparse"), tmp_path / "ckpt")
    _single_shard(ckpt).unlink()
    day0 = Path(sys.executable).parent / "day0"
    r = subprocess.run([str(day0), "compile", str(ckpt), "-o", str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("day0: error:") and "safetensors" in last


def test_prompt_longer_than_max_seq_len(artifact):
    s = Session.load(artifact("ds-sparse"))
    with pytest.raises(SessionError, match=r"max_seq_len 64"):
        s.prefill(list(range(65)))
    with pytest.raises(SessionError, match=r"max_new_tokens 50 needs 69 positions, more than max_seq_len 64"):
        s.generate(list(range(20)), max_new_tokens=50)


def test_token_outside_vocabulary(artifact):
    s = Session.load(artifact("ds-sparse"))
    with pytest.raises(SessionError, match=r"token id 320 is outside the vocabulary \[0, 320\)"):
        s.prefill([1, 2, 320])
    with pytest.raises(SessionError, match=r"token id -1"):
        s.decode(-1)
    assert s.position == 0  # nothing was appended by the failed calls


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_invalid_sampling_values(artifact, kwargs, name):
    s = Session.load(artifact("ds-sparse"))
    with pytest.raises(ValueError, match=name):
        s.generate([1, 2, 3], max_new_tokens=2, **kwargs)


def test_interrupted_compile_leaves_nothing_loadable(checkpoint, tmp_path, monkeypatch):
    import day0.lowering.compile as lc

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(lc, "compile_mlir", interrupted)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        _compile(checkpoint("ds-sparse"), out)
    assert not out.exists()
    assert not list(tmp_path.glob(".out.partial-*"))
    out.mkdir()  # a directory left by something else
    with pytest.raises(ArtifactError, match="no manifest.json"):
        Session.load(out)


def test_artifact_whose_files_changed(checkpoint, artifact, tmp_path):
    ckpt = _copy(checkpoint("ds-sparse"), tmp_path / "ckpt")
    art = _copy(artifact("ds-sparse"), tmp_path / "art")
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["parameters"]["base_dir"] = str(ckpt)
    (art / "manifest.json").write_text(json.dumps(manifest))
    Session.load(art)  # the copy itself is intact
    shard = _single_shard(ckpt)
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=rf"{shard.name}.*changed"):
        Session.load(art)
    vmfb = art / "model.vmfb"
    vmfb.write_bytes(vmfb.read_bytes() + b"\0")
    with pytest.raises(ArtifactError, match="model.vmfb"):
        Session.load(art, verify=True)


# --- MXFP4 checkpoints -----------------------------------------------------------------------

OSS_BLOCKS = "model.layers.0.mlp.experts.down_proj_blocks"
OSS_SCALES = "model.layers.0.mlp.experts.down_proj_scales"


def test_nan_scale_byte(checkpoint, tmp_path):
    from day0.models.mxfp4 import Mxfp4Error

    ckpt = _copy(checkpoint("oss-base"), tmp_path / "ckpt")

    def poison(t):
        t[OSS_SCALES] = t[OSS_SCALES].clone()
        t[OSS_SCALES][1, 2, 0] = 0xFF

    _rewrite_tensor(ckpt, OSS_SCALES, poison)
    with pytest.raises(Mxfp4Error, match=rf"{OSS_SCALES}.*0xFF"):
        _compile(ckpt, tmp_path / "out")


def test_missing_scales_tensor(checkpoint, tmp_path):
    ckpt = _copy(checkpoint("oss-base"), tmp_path / "ckpt")
    _rewrite_tensor(ckpt, OSS_SCALES, lambda t: t.pop(OSS_SCALES))
    with pytest.raises(CheckpointError, match=rf"missing tensor {OSS_SCALES}"):
        _compile(ckpt, tmp_path / "out")


def test_blocks_and_scales_disagree(checkpoint, tmp_path):
    ckpt = _copy(checkpoint("oss-base"), tmp_path / "ckpt")

    def shrink(t):
        t[OSS_SCALES] = t[OSS_SCALES][:, :, :1].contiguous()

    _rewrite_tensor(ckpt, OSS_SCALES, shrink)
    with pytest.raises(CheckpointError, match=rf"{OSS_SCALES}.*has shape"):
        _compile(ckpt, tmp_path / "out")


def test_packed_bytes_with_wrong_dtype(checkpoint, tmp_path):
    ckpt = _copy(checkpoint("oss-base"), tmp_path / "ckpt")

    def as_int8(t):
        t[OSS_BLOCKS] = t[OSS_BLOCKS].view(torch.int8)

    _rewrite_tensor(ckpt, OSS_BLOCKS, as_int8)
    with pytest.raises(CheckpointError, match=rf"{OSS_BLOCKS}.*I8"):
        _compile(ckpt, tmp_path / "out")


@pytest.mark.parametrize(
    "name, quantization_config, field",
    [
        ("oss-base", {"quant_method": "gptq"}, "quant_method"),
        ("ds-sparse-mxfp4", {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}, "format"),
        ("ds-sparse-mxfp4", {"quant_method": "fp8"}, "quant_method"),
    ],
)
def test_unknown_quant_method(checkpoint, tmp_path, name, quantization_config, field):
    from day0.models.mxfp4 import Mxfp4Error

    ckpt = _copy(checkpoint(name), tmp_path / "ckpt")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["quantization_config"] = quantization_config
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises((ConfigError, Mxfp4Error), match=field):
        _compile(ckpt, tmp_path / "out")
