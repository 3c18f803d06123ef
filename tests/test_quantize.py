"""`day0 quantize` (models/quantize.py): routed experts of a tiny deepseek_v32 checkpoint to the
compressed-tensors layout and of a tiny gpt_oss checkpoint to the gpt-oss layout, read back by
transformers (Mxfp4Config(dequantize=True) for gpt-oss, our dequantize_checkpoint for both), the
rest byte for byte; the failures leave nothing behind; the CLI end to end."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from day0.models.checkpoint import Checkpoint
from day0.models.mxfp4 import (
    Mxfp4Error,
    compressed_tensors_quantization_config,
    dequantize,
    gpt_oss_blocks_to_packed,
    gpt_oss_quantization_config,
    quantize,
)
from day0.models.quantize import dequantize_checkpoint, quantize_checkpoint

DAY0 = str(Path(sys.executable).parent / "day0")
EXPERT = "model.layers.1.mlp.experts.{e}.{p}_proj"


def tensors(path: Path) -> dict[str, torch.Tensor]:
    ckpt = Checkpoint.open(path)
    out = {}
    for f in ckpt.files:
        with safe_open(str(f), "pt") as shard:
            out.update({n: shard.get_tensor(n) for n in shard.keys()})
    return out


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.numpy().tobytes() == b.numpy().tobytes()


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    """A tiny deepseek_v32 checkpoint in several shards and its compressed-tensors quantization."""
    from day0.tools.checkpoints.demo import tiny_deepseek_v32_config, write_tiny_checkpoint

    work = tmp_path_factory.mktemp("quantize-ds")
    src = write_tiny_checkpoint(
        work / "src",
        tiny_deepseek_v32_config(
            hidden_size=64, moe_intermediate_size=32, n_routed_experts=4, n_group=2, num_experts_per_tok=2
        ),
        seed=5,
        max_shard_size="100KB",
    )
    dst = quantize_checkpoint(src, work / "mxfp4", "compressed-tensors")
    return src, dst


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    from transformers import GptOssConfig, GptOssForCausalLM

    work = tmp_path_factory.mktemp("quantize-gpt-oss")
    config = GptOssConfig(
        hidden_size=64,
        intermediate_size=64,
        num_local_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        head_dim=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GptOssForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(work / "src")
    dst = quantize_checkpoint(work / "src", work / "mxfp4", "gpt-oss")
    return work / "src", dst


def test_compressed_tensors_layout(deepseek):
    src, dst = deepseek
    before, after = tensors(src), tensors(dst)
    experts = [n for n in before if ".mlp.experts." in n]
    assert len(experts) == 4 * 3  # one MoE layer, 4 experts, gate/up/down
    for name, t in before.items():
        if name in experts:
            module = name.removesuffix(".weight")
            packed, scale = after[f"{module}.weight_packed"], after[f"{module}.weight_scale"]
            assert packed.dtype == scale.dtype == torch.uint8
            out, k = t.shape
            assert packed.shape == (out, k // 2) and scale.shape == (out, k // 32)
            assert name not in after
        else:
            assert same_bytes(after[name], t), name
    assert len(after) == len(before) + len(experts)

    src_ckpt, dst_ckpt = Checkpoint.open(src), Checkpoint.open(dst)
    assert len(src_ckpt.files) > 1
    assert [f.name for f in dst_ckpt.files] == [f.name for f in src_ckpt.files]
    assert (dst / "model.safetensors.index.json").is_file()
    assert (dst / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    assert (dst / "generation_config.json").is_file()

    config = json.loads((dst / "config.json").read_text())
    qc = config.pop("quantization_config")
    assert config == json.loads((src / "config.json").read_text())
    assert qc == compressed_tensors_quantization_config(qc["ignore"])
    assert qc["format"] == "mxfp4-pack-quantized" and qc["quant_method"] == "compressed-tensors"
    assert "model.layers.1.mlp.shared_experts.up_proj" in qc["ignore"] and "lm_head" in qc["ignore"]
    assert not any(".mlp.experts." in m for m in qc["ignore"])


def test_dequantize_checkpoint_compressed_tensors(deepseek, tmp_path):
    from transformers import DeepseekV32ForCausalLM

    src, dst = deepseek
    back = dequantize_checkpoint(dst, tmp_path / "f32")
    before, restored = tensors(src), tensors(back)
    assert restored.keys() == before.keys()
    for name, t in before.items():
        if ".mlp.experts." in name:
            want = dequantize(*quantize(t.numpy(), name))
            assert restored[name].dtype == torch.float32
            assert np.array_equal(restored[name].numpy(), want), name
        else:
            assert same_bytes(restored[name], t), name
    assert "quantization_config" not in json.loads((back / "config.json").read_text())
    model, info = DeepseekV32ForCausalLM.from_pretrained(back, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    experts = model.model.layers[1].mlp.experts  # transformers fuses: gate_up [E, 2I, H], down [E, H, I]
    for e in range(4):
        gate, up, down = (restored[EXPERT.format(e=e, p=p) + ".weight"] for p in ("gate", "up", "down"))
        assert torch.equal(experts.gate_up_proj[e].detach(), torch.cat([gate, up]))
        assert torch.equal(experts.down_proj[e].detach(), down)


def test_gpt_oss_layout_loads_in_transformers(gpt_oss, tmp_path):
    from transformers import GptOssForCausalLM, Mxfp4Config

    src, dst = gpt_oss
    before, after = tensors(src), tensors(dst)
    config = json.loads((dst / "config.json").read_text())
    assert config["quantization_config"] == gpt_oss_quantization_config()
    for layer in range(2):
        prefix = f"model.layers.{layer}.mlp.experts."
        for proj, (n_in, n_out) in (("gate_up_proj", (64, 128)), ("down_proj", (64, 64))):
            assert before[prefix + proj].shape == (4, n_in, n_out)  # saved as [E, in, out]
            blocks, scales = after[prefix + proj + "_blocks"], after[prefix + proj + "_scales"]
            assert blocks.dtype == scales.dtype == torch.uint8
            assert blocks.shape == (4, n_out, n_in // 32, 16) and scales.shape == (4, n_out, n_in // 32)
            assert prefix + proj not in after
            assert same_bytes(after[prefix + proj + "_bias"], before[prefix + proj + "_bias"])

    # transformers on CPU: dequantize=True skips the triton/kernels path (no device_map needed);
    # the dequantized weights land in the dtype asked for.
    model = GptOssForCausalLM.from_pretrained(
        dst, quantization_config=Mxfp4Config(dequantize=True), dtype=torch.float32
    ).eval()
    for layer in range(2):
        experts = model.model.layers[layer].mlp.experts
        for proj in ("gate_up_proj", "down_proj"):
            name = f"model.layers.{layer}.mlp.experts.{proj}"
            ours = dequantize(
                gpt_oss_blocks_to_packed(after[name + "_blocks"].numpy()), after[name + "_scales"].numpy()
            ).transpose(0, 2, 1)
            theirs = getattr(experts, proj).detach()
            assert theirs.dtype == torch.float32
            assert np.array_equal(theirs.numpy(), ours), name
            assert np.array_equal(
                ours, dequantize(*quantize(before[name].numpy().transpose(0, 2, 1).copy())).transpose(0, 2, 1)
            )

    # our dequantized checkpoint loads with plain from_pretrained and gives the same logits
    back = dequantize_checkpoint(dst, tmp_path / "f32")
    plain = GptOssForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 17, 99, 4, 64, 1]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, plain(ids).logits)
    assert tensors(back).keys() == before.keys()


def _bad_checkpoint(path: Path) -> Path:
    """A per-expert checkpoint whose expert `in` (48) is not a multiple of 32."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "deepseek_v32"}))
    save_file(
        {
            EXPERT.format(e=0, p="gate") + ".weight": torch.ones(32, 48),
            EXPERT.format(e=0, p="down") + ".weight": torch.ones(48, 32),
            "model.norm.weight": torch.ones(48),
        },
        str(path / "model.safetensors"),
    )
    return path


def test_k_not_multiple_of_32_writes_nothing(tmp_path):
    src = _bad_checkpoint(tmp_path / "bad")
    with pytest.raises(
        Mxfp4Error,
        match=r"tensor model.layers.1.mlp.experts.0.gate_proj.weight .*"
        r"input dimension 48 is not a multiple of 32",
    ):
        quantize_checkpoint(src, tmp_path / "out", "compressed-tensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]  # no dst, no temp dir


def test_layout_must_fit_the_checkpoint(deepseek, gpt_oss, tmp_path):
    with pytest.raises(Mxfp4Error, match="--layout gpt-oss is for gpt_oss checkpoints"):
        quantize_checkpoint(deepseek[0], tmp_path / "a", "gpt-oss")
    with pytest.raises(Mxfp4Error, match="it is a gpt_oss checkpoint, use --layout gpt-oss"):
        quantize_checkpoint(gpt_oss[0], tmp_path / "b", "compressed-tensors")
    with pytest.raises(Mxfp4Error, match="already quantized"):
        quantize_checkpoint(deepseek[1], tmp_path / "c")
    with pytest.raises(Mxfp4Error, match="no quantization_config"):
        dequantize_checkpoint(deepseek[0], tmp_path / "d")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "keep").write_text("x")
    with pytest.raises(Mxfp4Error, match="already exists"):
        quantize_checkpoint(deepseek[0], tmp_path / "e")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]


def test_cli_quantize(deepseek, tmp_path):
    src, dst = deepseek
    r = subprocess.run([DAY0, "quantize", str(src), "-o", str(tmp_path / "q")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "quant_method compressed-tensors" in r.stdout
    for f in Checkpoint.open(dst).files:  # deterministic: same bytes as the library call
        assert (tmp_path / "q" / f.name).read_bytes() == f.read_bytes()

    bad = _bad_checkpoint(tmp_path / "bad")
    r = subprocess.run([DAY0, "quantize", str(bad), "-o", str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("day0: error: tensor ") and "multiple of 32" in lines[0]
    assert not (tmp_path / "out").exists()


def test_dequantize_pairs_split_across_shards_and_scale_ff(tmp_path):
    """compressed-tensors packed in one shard, its scales in another; then a 0xFF scale."""
    module = EXPERT.format(e=0, p="up")
    w = np.linspace(-3, 3, 16 * 64, dtype=np.float32).reshape(16, 64)
    packed, scales = quantize(w, module)

    def write(path: Path, scales: np.ndarray) -> Path:
        path.mkdir()
        config = {
            "model_type": "deepseek_v32",
            "quantization_config": compressed_tensors_quantization_config(["lm_head"]),
        }
        (path / "config.json").write_text(json.dumps(config))
        save_file(
            {f"{module}.weight_packed": torch.from_numpy(packed), "lm_head.weight": torch.ones(4, 4)},
            str(path / "a.safetensors"),
        )
        save_file({f"{module}.weight_scale": torch.from_numpy(scales)}, str(path / "b.safetensors"))
        return path

    back = dequantize_checkpoint(write(tmp_path / "split", scales), tmp_path / "f32")
    restored = tensors(back)
    assert sorted(restored) == ["lm_head.weight", f"{module}.weight"]
    assert np.array_equal(restored[f"{module}.weight"].numpy(), dequantize(packed, scales))

    bad = scales.copy()
    bad[3, 1] = 0xFF
    with pytest.raises(Mxfp4Error, match=rf"tensor {module}.weight_packed: scale byte 0xFF"):
        dequantize_checkpoint(write(tmp_path / "nan", bad), tmp_path / "nan-f32")
    assert not (tmp_path / "nan-f32").exists()
