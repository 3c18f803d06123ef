"""Opening an artifact for running it (Session and Engine alike): the manifest read and
verified, the device checked against the artifact's target, the module loaded from the very bytes
verified and checked against the manifest before any weight is read; and the token-id checks
every entry takes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from day0.runtime.artifact import VMFB, ArtifactError, Manifest, check_signatures, read_manifest, read_vmfb


def open_artifact(artifact_dir, device: str | None, verify: bool, checkpoint_dir=None) -> tuple[Manifest, object]:
    """(manifest, runtime.vm.VmModule) of the artifact; `device` None: its target's first."""
    from day0.runtime.vm import VmModule

    # the vmfb is hashed once, as the bytes that are loaded (read_vmfb)
    manifest = read_manifest(Path(artifact_dir), verify=verify, checkpoint_dir=checkpoint_dir, vmfb_hash=False)
    device = manifest.devices[0] if device is None else device
    if device not in manifest.devices:
        raise ArtifactError(
            f"artifact {artifact_dir} was compiled for target {manifest.target}, which runs on "
            f"{' or '.join(manifest.devices)}, not on device '{device}' (compile it with "
            f"--target for that device)"
        )
    params = manifest.parameters
    vm = VmModule.load(
        Path(artifact_dir) / VMFB,
        [Path(params.base_dir) / f.path for f in params.files],
        device=device,
        scope=params.scope,
        vmfb_bytes=read_vmfb(artifact_dir, manifest, verify),
        check=lambda reflection: check_signatures(manifest, reflection, str(artifact_dir)),
        devices=manifest.device_count,
    )
    return manifest, vm


def token_ids(ids, vocab_size: int, error: type[Exception]) -> np.ndarray:
    """ids as int64 [n], n >= 1, each in [0, vocab_size); else `error` naming the first bad one."""
    if isinstance(ids, (str, bytes)):
        raise error(f"token ids must be a list of integers, not {type(ids).__name__} (tokenize it first)")
    try:
        arr = np.asarray(ids)
    except (TypeError, ValueError) as e:
        raise error(f"token ids must be a 1-D list of integers ({e})") from None
    if arr.ndim != 1:
        raise error(f"token ids must be a 1-D list of integers (got shape {arr.shape})")
    if arr.size == 0:
        raise error("token ids are empty: a prompt needs at least one token")
    if not np.issubdtype(arr.dtype, np.integer):  # floats, bools, ints beyond int64 (object)
        for t in arr.tolist():
            if isinstance(t, bool) or not isinstance(t, int):
                raise error(f"token id {t!r} is not an integer")
            if not 0 <= t < vocab_size:
                raise error(f"token id {t} is outside the vocabulary [0, {vocab_size})")
    bad = arr[(arr < 0) | (arr >= vocab_size)]
    if bad.size:
        raise error(f"token id {int(bad[0])} is outside the vocabulary [0, {vocab_size})")
    return arr.astype(np.int64)
