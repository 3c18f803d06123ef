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
        (lambda d: d.update(max_seq_len="64"), r"field 'max_seq_len' is '64', not int"),
        (lambda d: d.update(devices="cuda"), r"field 'devices' is 'cuda'"),
        (lambda d: d["state"][0].update(shape=[64, "8"]), r"field 'state\[0\]\.shape' is \[64, '8'\]"),
        (lambda d: d["state"][0].update(layer=True), r"field 'state\[0\]\.layer' is True, not int"),
        (lambda d: d["entry_points"]["decode"].pop("outputs"), r"missing field 'entry_points\.decode\.outputs'"),
        (lambda d: d["parameters"].update(files={}), r"field 'parameters\.files' is \{\}"),
        (lambda d: d.update(entry_points=[]), r"field 'entry_points' is \[\], not dict"),
        (lambda d: d.update(state=[7]), r"field 'state' is \[7\]"),
    ],
)
def test_a_malformed_manifest_names_the_field(edit, field):
    data = json.loads(json.dumps(_manifest().to_json()))
    edit(data)
    with pytest.raises(ArtifactError, match=rf"malformed manifest .*{field}"):
        Manifest.from_json(data)


def test_unreadable_manifest_files_are_named(tmp_path):
    from day0.runtime.artifact import read_manifest

    (tmp_path / "manifest.json").write_bytes(b"\xff\xfe{not json")
    with pytest.raises(ArtifactError, match=r"manifest\.json: not valid JSON"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("[1, 2]")
    with pytest.raises(ArtifactError, match=r"manifest\.json: not a JSON object"):
        read_manifest(tmp_path)
