"""The manifest is one typed record (runtime/artifact.py): what the driver writes is what the runtime
reads, field for field; another format version or a malformed file is refused by name."""

import json

import pytest

from day0.runtime.artifact import (
    FORMAT_VERSION,
    ArtifactError,
    EntryPoint,
    FileRecord,
    Manifest,
    Parameters,
    StateTensor,
)


def _manifest() -> Manifest:
    return Manifest(
        architecture="deepseek_v32",
        config={"model_type": "deepseek_v32", "hidden_size": 64},
        target="llvm-cpu",
        devices=("local-task", "local-sync"),
        max_seq_len=128,
        vocab_size=320,
        eos_token_id=[1, 2],
        entry_points={
            "decode": EntryPoint(("token[1] int64",), ("logits[1,V] float32", "next[1] int64")),
            "prefill_chunk": EntryPoint(("ids[C] int64",), ("logits[C,V] float32",), static_len=64),
        },
        state=(
            StateTensor("kv_cache.0", "mla_latent", 0, (128, 40), "float32"),
            StateTensor("index_cache.0", "indexer_keys", 0, (128, 32), "bfloat16"),
        ),
        parameters=Parameters("model", "/ckpt", (FileRecord("model.safetensors", 10, "ab" * 32),), 7),
        compile_flags=("--iree-opt-level=O3",),
        tools={"day0": "0.1.0"},
        vmfb=FileRecord("model.vmfb", 5, "cd" * 32),
    )


def test_json_round_trip_is_exact():
    m = _manifest()
    again = Manifest.from_json(json.loads(json.dumps(m.to_json())))
    assert again == m
    assert again.prefill_chunk == 64 and again.eos_token_ids == {1, 2}
    assert again.state_bytes() == {"mla_latent": 128 * 40 * 4, "indexer_keys": 128 * 32 * 2}
    assert again.parameters.nbytes == 10


def test_another_format_version_is_refused_by_name():
    data = _manifest().to_json()
    data["format_version"] = FORMAT_VERSION - 1
    with pytest.raises(
        ArtifactError,
        match=rf"x/manifest.json: artifact format version {FORMAT_VERSION - 1} "
        rf"is not this day0's {FORMAT_VERSION}",
    ):
        Manifest.from_json(data, "x/manifest.json")


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda d: d.pop("devices"), "devices"),
        (lambda d: d["state"][0].pop("kind"), "kind"),
        (lambda d: d.update(surprise=1), "surprise"),
        (lambda d: d["entry_points"]["decode"].update(len=3), "len"),
    ],
)
def test_a_malformed_manifest_names_the_field(edit, field):
    data = json.loads(json.dumps(_manifest().to_json()))
    edit(data)
    with pytest.raises(ArtifactError, match=rf"malformed manifest .*{field}"):
        Manifest.from_json(data)
