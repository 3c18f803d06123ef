"""The artifact directory: `manifest.json` + `model.vmfb` (+ `tokenizer.json` when the checkpoint
has one). Weights are not copied: the manifest names the original shards with sizes and hashes.

Writing is atomic: everything goes to a hidden sibling directory that is renamed into place last,
so an interrupted compile never leaves a directory `read_manifest` accepts.
"""

import json
import os
import shutil
from pathlib import Path

from day0.runtime.files import FileRecordError, sha256_file, verify_file_records

MANIFEST = "manifest.json"
VMFB = "model.vmfb"
FORMAT_VERSION = 1


class ArtifactError(ValueError):
    pass



def staging_dir(out_dir: Path) -> Path:
    """A fresh hidden sibling of out_dir to build the artifact in."""
    out_dir = Path(out_dir).resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def publish(tmp: Path, out_dir: Path, manifest: dict) -> None:
    """Write the manifest (vmfb hash included) last, then move tmp to out_dir."""
    manifest = dict(manifest, format_version=FORMAT_VERSION,
                    vmfb={"path": VMFB, "size": (tmp / VMFB).stat().st_size, "sha256": sha256_file(tmp / VMFB)})
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    out_dir = Path(out_dir).resolve()
    if out_dir.exists():
        if not (out_dir / MANIFEST).exists() and any(out_dir.iterdir()):
            raise ArtifactError(f"{out_dir} exists and is not a day0 artifact; refusing to replace it")
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
        out_dir.rename(old)
        tmp.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out_dir)


def state_bytes(manifest: dict) -> dict[str, int]:
    """Bytes of device state per kind (mla_latent, indexer_keys, kda_state, conv_tail, ...)."""
    import numpy as np

    from day0.runtime.state_file import np_dtype

    out: dict[str, int] = {}
    for s in manifest["state"]:
        out[s["kind"]] = out.get(s["kind"], 0) + int(np.prod(s["shape"])) * np_dtype(s["dtype"]).itemsize
    return out


def read_manifest(artifact_dir: Path, verify: bool = True, checkpoint_dir=None) -> dict:
    """The manifest of a complete artifact: the vmfb and the shards must exist with their recorded
    sizes and, with verify, hashes. `checkpoint_dir` replaces the recorded shard directory (the
    checkpoint moved, e.g. regenerated on another host)."""
    artifact_dir = Path(artifact_dir)
    path = artifact_dir / MANIFEST
    if not artifact_dir.is_dir():
        raise ArtifactError(f"{artifact_dir}: no such artifact directory")
    if not path.exists():
        raise ArtifactError(f"{artifact_dir}: no {MANIFEST}; not a day0 artifact, or its compile was "
                            f"interrupted — compile again")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{path}: invalid JSON ({e})") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{path}: format_version {manifest.get('format_version')} is not "
                            f"{FORMAT_VERSION}; recompile with this day0")
    if checkpoint_dir is not None:
        manifest["parameters"]["base_dir"] = str(Path(checkpoint_dir).resolve())
    try:  # without verify, still every file present with its recorded size (no data read)
        verify_file_records([manifest["vmfb"]], artifact_dir, hashes=verify)
        verify_file_records(manifest["parameters"]["files"], manifest["parameters"]["base_dir"], hashes=verify)
    except FileRecordError as e:
        raise ArtifactError(f"artifact {artifact_dir}: {e}") from None
    return manifest
