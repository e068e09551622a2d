"""The CUDA driver API through ctypes: the few calls FleetSight's GPU measurements need.

``libcuda.so.1`` is installed by the NVIDIA driver itself, so this works on any GPU node without the CUDA
toolkit or a Python package. Used by the node agent's PCIe probe (``exporters/probes.py``) and by the
checks' GPU probe (``checks/gpu_probe.py``). Signatures and the ``_v2`` entry points follow ``cuda.h``
(``#define cuMemAlloc cuMemAlloc_v2`` and so on: the unsuffixed symbols are the 32-bit legacy ones).

Every failing call raises :class:`CudaError` naming the call and its ``CUresult`` (``cuGetErrorName``),
e.g. ``cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (2)``; a driver library that cannot be loaded is a
:class:`CudaError` too.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager

LIBRARY = "libcuda.so.1"
# Another driver library than the dynamic linker's (CUDA's forward-compatibility package installs one at
# /usr/local/cuda/compat/libcuda.so.1): a path or a soname.
LIBRARY_ENV = "FLEETSIGHT_CUDA_LIBRARY"

_size_t, _int, _uint, _ptr = ctypes.c_size_t, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p
_dptr = ctypes.c_uint64  # CUdeviceptr: unsigned long long on 64-bit hosts
# name -> argtypes (every call returns a CUresult, an int)
SIGNATURES: dict[str, list[type]] = {
    "cuInit": [_uint],
    "cuGetErrorName": [_int, ctypes.POINTER(ctypes.c_char_p)],
    "cuDeviceGetCount": [ctypes.POINTER(_int)],
    "cuDeviceGet": [ctypes.POINTER(_int), _int],
    "cuDeviceGetPCIBusId": [ctypes.c_char_p, _int, _int],
    "cuDevicePrimaryCtxRetain": [ctypes.POINTER(_ptr), _int],
    "cuDevicePrimaryCtxRelease_v2": [_int],
    "cuCtxSetCurrent": [_ptr],
    "cuCtxSynchronize": [],
    "cuMemGetInfo_v2": [ctypes.POINTER(_size_t), ctypes.POINTER(_size_t)],
    "cuMemAlloc_v2": [ctypes.POINTER(_dptr), _size_t],
    "cuMemFree_v2": [_dptr],
    "cuMemAllocHost_v2": [ctypes.POINTER(_ptr), _size_t],
    "cuMemFreeHost": [_ptr],
    "cuMemcpyHtoD_v2": [_dptr, _ptr, _size_t],
    "cuMemcpyDtoD_v2": [_dptr, _dptr, _size_t],
    "cuMemsetD8_v2": [_dptr, ctypes.c_ubyte, _size_t],
}


class CudaError(RuntimeError):
    """A CUDA (or cuBLAS) library that cannot be loaded, or a call that failed: the message says which."""


def load_library(names: list[str], what: str) -> ctypes.CDLL:
    """The first of ``names`` that loads (a soname the dynamic linker searches for, or a path)."""
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
    raise CudaError(f"cannot load {what} ({'; '.join(errors)})")


class CudaDriver:
    """``libcuda.so.1``, initialised (``cuInit``). One object may serve several threads: each makes its
    GPU's context current on itself (:meth:`primary_context`)."""

    def __init__(self, library: str | None = None) -> None:
        library = library or os.environ.get(LIBRARY_ENV) or LIBRARY
        lib = load_library([library], f"{library}, the CUDA driver library the NVIDIA driver installs")
        for name, argtypes in SIGNATURES.items():
            try:
                function = getattr(lib, name)
            except AttributeError as exc:
                raise CudaError(f"{library} has no {name}: a CUDA driver older than 11.0?") from exc
            function.argtypes, function.restype = argtypes, ctypes.c_int
        self.lib = lib
        self.check(lib.cuInit(0), "cuInit")

    def error_name(self, status: int) -> str:
        name = ctypes.c_char_p()
        if self.lib.cuGetErrorName(status, ctypes.byref(name)) == 0 and name.value:
            return name.value.decode(errors="replace")
        return "unknown CUresult"

    def check(self, status: int, call: str) -> None:
        if status != 0:
            raise CudaError(f"{call} failed: {self.error_name(status)} ({status})")

    def device_count(self) -> int:
        count = ctypes.c_int()
        self.check(self.lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
        return count.value

    def device(self, ordinal: int) -> int:
        device = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
        return device.value

    def pci_bus_id(self, ordinal: int) -> str:
        """``0000:18:00.0`` as the driver spells it."""
        bus_id = ctypes.create_string_buffer(32)
        self.check(self.lib.cuDeviceGetPCIBusId(bus_id, 32, self.device(ordinal)), "cuDeviceGetPCIBusId")
        return bus_id.value.decode()

    @contextmanager
    def primary_context(self, ordinal: int) -> Iterator[None]:
        """The GPU's primary context (the one the CUDA runtime and cuBLAS use), current on this thread."""
        device = self.device(ordinal)
        context = ctypes.c_void_p()
        self.check(
            self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain"
        )
        try:
            self.check(self.lib.cuCtxSetCurrent(context), "cuCtxSetCurrent")
            yield
        finally:
            self.lib.cuCtxSetCurrent(None)
            self.lib.cuDevicePrimaryCtxRelease_v2(device)

    def synchronize(self) -> None:
        self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current context's GPU."""
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.check(self.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo_v2")
        return free.value, total.value

    @contextmanager
    def device_memory(self, nbytes: int) -> Iterator[int]:
        """``nbytes`` of GPU memory in the current context, freed on exit: the device pointer."""
        pointer = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(pointer), nbytes), "cuMemAlloc_v2")
        try:
            yield pointer.value
        finally:
            self.lib.cuMemFree_v2(pointer.value)

    @contextmanager
    def pinned_memory(self, nbytes: int) -> Iterator[int]:
        """``nbytes`` of page-locked host memory, freed on exit: its address."""
        pointer = ctypes.c_void_p()
        self.check(self.lib.cuMemAllocHost_v2(ctypes.byref(pointer), nbytes), "cuMemAllocHost_v2")
        try:
            yield pointer.value or 0
        finally:
            self.lib.cuMemFreeHost(pointer)

    def copy_to_device(self, target: int, source: int | bytes | ctypes.Array, nbytes: int) -> None:
        """Host ``source`` (an address, bytes or a ctypes buffer) to device ``target``; synchronous for
        pageable memory, asynchronous for pinned (``cuMemcpyHtoD``'s own rules)."""
        self.check(self.lib.cuMemcpyHtoD_v2(target, source, nbytes), "cuMemcpyHtoD_v2")

    def copy_on_device(self, target: int, source: int, nbytes: int) -> None:
        """Device to device; asynchronous to the host (:meth:`synchronize` to wait)."""
        self.check(self.lib.cuMemcpyDtoD_v2(target, source, nbytes), "cuMemcpyDtoD_v2")

    def fill(self, target: int, byte: int, nbytes: int) -> None:
        self.check(self.lib.cuMemsetD8_v2(target, byte, nbytes), "cuMemsetD8_v2")


def pci_bus_order() -> None:
    """Number GPUs as nvidia-smi, NVML and the rest of FleetSight do (PCI bus order), not fastest-first:
    must be set before the driver initialises; a site's own CUDA_DEVICE_ORDER wins."""
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
