"""A thin layer over `iree.runtime`: one compiled module, its parameters, one device.

    vm = VmModule.load("model.vmfb", [shard1, shard2], device="local-task")
    step = vm.function("decode")
    cache = vm.to_device(np.zeros((T, D), np.float32))
    cache, logits = step(cache, pos, token)        # DeviceArrays; logits.to_host() reads back

Parameters: the vmfb names its weights `#flow.parameter.named<"model"::"<key>">`; every key
is looked up in one `ParameterIndex` built from the checkpoint's own safetensors shards
(`.irpa` and `.gguf` also load; the format comes from the file extension). The files are
memory-mapped, never copied into the vmfb. The context's initializer loads every parameter
(and computes anything IREE hoisted, e.g. stacked experts) once, inside `load`.

Tied outputs (which results alias an argument, measured on IREE 3.13 local-task):
  * A function that returns a state argument updated by a scatter (`index_copy`, `index_put`,
    slice assignment), and does not read the old value after the update, returns *the same
    device buffer* it was given: IREE updates it in place (`util.return %argN` in the stream
    IR). No copy is made.
  * So a DeviceArray passed as such an argument is consumed: after the call it holds the new
    state, as does the returned array (same buffer). Keep using the returned one; pass a copy
    (`vm.to_device(arr.to_host())`) if the old value must survive.
  * A numpy argument is first copied to a fresh device buffer, so numpy arrays are never
    modified.
  * Any other result is a fresh buffer.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from iree import runtime as rt

DEVICES = ("local-task", "local-sync", "cuda")


class VmError(RuntimeError):
    """The module cannot be loaded here: unknown or absent device, missing file, failed initializer."""


class UnknownDeviceError(VmError, ValueError):
    """A device name day0 does not know (a bad argument, hence also a ValueError)."""


def get_device(name: str) -> rt.HalDevice:
    """The HAL device called `name` (one of DEVICES); clear errors when unknown or absent."""
    if name not in DEVICES:
        raise UnknownDeviceError(f"unknown device {name!r}; known devices: {', '.join(DEVICES)}")
    driver = name  # the device names are IREE driver names
    if driver not in rt.query_available_drivers():
        raise VmError(f"device {name!r}: this iree-base-runtime has no {driver!r} driver")
    try:
        return rt.get_device(name)
    except (RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise VmError(f"device {name!r} is not available on this machine ({first})") from None


def get_devices(name: str, count: int) -> list[rt.HalDevice]:
    """`count` distinct HAL devices of kind `name` for a module compiled for that many (`day0
    compile --devices N`): local-task gives N independent CPU devices (each its own task
    executor: how the CPU stands in for N GPUs). IREE maps the module's device i to the i-th of
    the list."""
    if count < 1:
        raise ValueError(f"a module needs at least one device, got {count}")
    first = get_device(name)
    if count == 1:
        return [first]
    if name != "local-task":
        raise VmError(f"the module spans {count} devices; day0 runs such modules on local-task so far, not {name}")
    # rt.get_device caches one device a URI: the others are made anew
    return [first] + [rt.get_driver(name).create_default_device() for _ in range(count - 1)]


def _private_copy(data: bytes) -> str:
    """A file only this process can write (mode 0600) holding `data`, for mapping: modules are
    mapped as they always were (IREE's file mapping), not copied from a Python buffer, whose
    results on the H200 differed at times (docs/perf.md, "The Engine on the H200")."""
    fd, path = tempfile.mkstemp(prefix="day0-", suffix=".vmfb")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


class VmModule:
    """A loaded vmfb bound to its parameters and a device. Build with `VmModule.load`."""

    def __init__(
        self,
        device: rt.HalDevice,
        instance: rt.VmInstance,
        context: rt.VmContext,
        module: rt.VmModule,
        parameter_files: tuple[Path, ...],
        keepalive: tuple = (),
        device_name: str = "local-task",
    ):
        self.device, self.device_name = device, device_name
        self.parameter_files = parameter_files
        # The instance, context and index must outlive every function handed out.
        self._instance, self._context, self._module = instance, context, module
        self._keepalive = keepalive  # parameter index + provider
        self._functions: dict[str, Callable[..., Any]] = {}

    @classmethod
    def load(
        cls,
        vmfb_path: Path,
        parameter_files: Sequence[Path] = (),
        device: str = "local-task",
        scope: str = "model",
        vmfb_bytes: bytes | None = None,
        check: Callable[[dict[str, dict[str, str]]], None] | None = None,
        devices: int = 1,
    ) -> VmModule:
        """Load `vmfb_path` (or, given, `vmfb_bytes`: the module already read and verified from
        that path, so that what runs is what was checked) with the parameters of
        `parameter_files` under `scope`.

        Runs the module's initializer: a parameter missing from every file fails here, naming
        the key and the files searched. `check`, given, sees {function: reflection} before the
        initializer runs (and before any weight is read) and may raise. `devices`: how many
        devices the module was compiled for (its first one holds the arguments and results).
        """
        vmfb_path = Path(vmfb_path)
        if vmfb_bytes is None and not vmfb_path.is_file():
            raise VmError(f"no compiled module at {vmfb_path}")
        hal_devices = get_devices(device, devices)
        hal_device = hal_devices[0]
        instance = rt.VmInstance()
        modules = [rt.create_hal_module(instance, devices=hal_devices)]
        files = tuple(Path(f) for f in parameter_files)
        keepalive: tuple = ()
        if files:
            index = rt.ParameterIndex()
            for f in files:
                if not f.is_file():
                    raise VmError(f"parameter file not found: {f}")
                index.load(str(f))  # format from the extension: .safetensors / .irpa / .gguf
            provider = index.create_provider(scope=scope)
            modules.append(rt.create_io_parameters_module(instance, provider))
            keepalive = (index, provider)
        try:
            if vmfb_bytes is None:
                module = rt.VmModule.mmap(instance, str(vmfb_path))
            else:
                copy = _private_copy(vmfb_bytes)
                try:
                    module = rt.VmModule.mmap(instance, copy)
                finally:
                    os.unlink(copy)  # the mapping keeps the bytes
        except (RuntimeError, ValueError) as e:
            raise VmError(f"{vmfb_path} is not a loadable IREE module ({str(e).strip().splitlines()[0]})") from None
        if check is not None:
            check({n: dict(module.lookup_function(n).reflection) for n in module.function_names})
        try:
            context = rt.VmContext(instance, modules=[*modules, module])
        except (RuntimeError, ValueError) as e:
            names = ", ".join(str(f) for f in files) or "none"
            raise VmError(
                f"initializing {vmfb_path} on {device} failed (parameter scope {scope!r}, files: {names}): {e}"
            ) from None
        return cls(hal_device, instance, context, module, files, (*keepalive, hal_devices), device)

    @property
    def function_names(self) -> list[str]:
        """The callable entry points (IREE's `$async` variants, their `$async_transients_size`
        queries and `__init` left out)."""
        return [n for n in self._module.function_names if "$" not in n and not n.startswith("__")]

    def function(self, name: str) -> Callable[..., Any]:
        """The entry point `name`: call it with numpy arrays or DeviceArrays.

        Returns one `iree.runtime.DeviceArray` for one result, a tuple for several; nothing
        is read back to the host until `.to_host()`.
        """
        fn = self._functions.get(name)
        if fn is None:
            vm_function = self._module.lookup_function(name)
            if vm_function is None or name not in self.function_names:
                raise KeyError(f"no function {name!r} in the module; it exports: {', '.join(self.function_names)}")
            fn = rt.FunctionInvoker(self._context, self.device, vm_function)
            self._functions[name] = fn
        return fn

    def async_function(self, name: str) -> rt.VmFunction:
        """The `$async` variant of entry point `name`, for `invoke` (runtime/step_call.py): its
        arguments end with a wait fence and a signal fence, and it returns before the device
        has run it."""
        if name not in self.function_names:
            raise KeyError(f"no function {name!r} in the module; it exports: {', '.join(self.function_names)}")
        return self._module.lookup_function(f"{name}$async")

    def exported_function(self, name: str) -> rt.VmFunction:
        """Any function the module exports by its own name (e.g. an `$async_transients_size`
        query, runtime/step_call.py)."""
        fn = self._module.lookup_function(name)
        if fn is None:
            raise KeyError(f"no function {name!r} in the module")
        return fn

    def invoke(self, function: rt.VmFunction, args: rt.VmVariantList, results: rt.VmVariantList) -> None:
        """Call `function` of this module's context with prepared argument and result lists."""
        self._context.invoke(function, args, results)

    def to_device(self, array: np.ndarray) -> rt.DeviceArray:
        """A device copy of `array` (C-contiguous; dtype kept)."""
        return rt.asdevicearray(self.device, np.ascontiguousarray(array))
