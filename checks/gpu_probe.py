"""fleetsight-gpu-probe: how fast each GPU of this node multiplies matrices and copies its memory.

  gemm  dense matrix multiplications (cuBLAS cublasGemmEx, square n x n, default 8192) for --seconds
        after a warm-up: tflops = 2 n^3 x multiplications / seconds / 1e12. bf16 (default) and fp16
        inputs and outputs accumulate in FP32 on the Tensor Cores; tf32 takes FP32 matrices and lets
        cuBLAS round them to TF32.
  hbm   device-to-device copies of one buffer (default 2 GiB; a quarter of the free memory when less is
        free) for --seconds: bytes_per_second = 2 x bytes copied / seconds (each byte is read and
        written once).

Every GPU of the node runs at once (or those of --gpus), as a job would load them; a line is printed per
GPU as it finishes, then a closing line; the test takes --seconds plus a few seconds of set-up and
warm-up:

  fleetsight-probe v1 test=gemm gpu=0 dtype=bf16 tflops=702.4 seconds=30.0
  fleetsight-probe v1 test=hbm gpu=0 bytes_per_second=2.93e+12 seconds=30.0
  fleetsight-probe v1 done gpus=8

Exit 0 when every GPU was measured; 2, with one line per problem on stderr naming the failed call and
its CUresult or cublasStatus, when the CUDA driver (libcuda.so.1) or cuBLAS (libcublas.so.12) cannot be
loaded or a call fails: then there is no closing line and the check reads the output as unreadable.
Needs only the NVIDIA driver (hbm) and the CUDA toolkit's cuBLAS (gemm), no Python package. GPUs are
numbered in PCI bus order, as nvidia-smi and DCGM number them (unless CUDA_DEVICE_ORDER says otherwise).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from fleetsight.cuda import CudaDriver, CudaError, load_library, pci_bus_order

PREFIX = "fleetsight-probe v1"  # the line format checks/parsers.py (probe_lines) reads
PROGRAM = "fleetsight-gpu-probe"

EPILOG = """\
what the figures are compared with (checks/catalog.yml, gemm_throughput and hbm_bandwidth): the
datasheet of the node's GPU, NVIDIA H100 SXM 80 GB for FleetSight's default catalogue: BF16 Tensor Core
989 TFLOPS dense (1,979 with sparsity), HBM3 3.35 TB/s. A real GEMM or copy reaches a share of those, so
each check fails a GPU below expected x min_ratio (0.60 for GEMM: 593 TFLOPS; 0.80 for HBM: 2.68 TB/s).
A GPU well below its peers of the same node is worth a look even above the floor.

run by hand on an idle node (every GPU free: the probe loads them all):
  fleetsight-gpu-probe gemm --seconds 30
  fleetsight-gpu-probe hbm --seconds 30 --gpus 0,3

"""

# ---------------------------------------------------------------------------------- cuBLAS
CUBLAS_LIBRARIES = [
    "libcublas.so.12",
    "libcublas.so.13",
    "libcublas.so",
    "libcublas.so.11",
    "/usr/local/cuda/lib64/libcublas.so.12",
    "/usr/local/cuda/lib64/libcublas.so",
]
CUBLAS_OP_N = 0
CUBLAS_GEMM_DEFAULT = -1
CUBLAS_STATUS = {  # cublas_api.h cublasStatus_t, for cuBLAS older than cublasGetStatusName (11.4.2)
    1: "CUBLAS_STATUS_NOT_INITIALIZED",
    3: "CUBLAS_STATUS_ALLOC_FAILED",
    7: "CUBLAS_STATUS_INVALID_VALUE",
    8: "CUBLAS_STATUS_ARCH_MISMATCH",
    11: "CUBLAS_STATUS_MAPPING_ERROR",
    13: "CUBLAS_STATUS_EXECUTION_FAILED",
    14: "CUBLAS_STATUS_INTERNAL_ERROR",
    15: "CUBLAS_STATUS_NOT_SUPPORTED",
    16: "CUBLAS_STATUS_LICENSE_ERROR",
}


@dataclass(frozen=True)
class GemmType:
    """cudaDataType of A, B and C (library_types.h), cublasComputeType_t, and how random elements are
    made: bits kept from random bytes, bits set, so that every element is finite with 2^-7 <= |x| < 2
    (an exponent field of 0b01..1xxx): no NaN, Inf or subnormal, and a sum of 8192 products stays
    finite even in fp16. Random data, not zeros: a GPU multiplying zeros draws less power and clocks
    higher than under a real job."""

    data_type: int
    compute_type: int
    element_bytes: int
    keep_bits: int
    set_bits: int


CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32 = 68, 77
DTYPES = {
    "bf16": GemmType(CUDA_R_16BF, CUBLAS_COMPUTE_32F, 2, 0x83FF, 0x3C00),
    "fp16": GemmType(CUDA_R_16F, CUBLAS_COMPUTE_32F, 2, 0x9FFF, 0x2000),
    "tf32": GemmType(CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 4, 0x83FFFFFF, 0x3C000000),
}


def random_elements(dtype: str, nbytes: int) -> bytes:
    """``nbytes`` of random ``dtype`` elements (see :class:`GemmType`), little-endian."""
    kind = DTYPES[dtype]
    count = nbytes // kind.element_bytes
    size = count * kind.element_bytes
    raw = int.from_bytes(os.urandom(size), "little")
    keep = int.from_bytes(kind.keep_bits.to_bytes(kind.element_bytes, "little") * count, "little")
    put = int.from_bytes(kind.set_bits.to_bytes(kind.element_bytes, "little") * count, "little")
    return ((raw & keep) | put).to_bytes(size, "little")


class Cublas:
    """``libcublas`` through ctypes: a handle per GPU (created while that GPU's context is current) and
    ``cublasGemmEx``, with the signatures of cublas_api.h."""

    def __init__(self, library: str | None = None) -> None:
        names = [library] if library else CUBLAS_LIBRARIES
        lib = load_library(names, f"cuBLAS ({', '.join(names)}; the CUDA toolkit's libraries)")
        p, i = ctypes.c_void_p, ctypes.c_int
        try:
            lib.cublasCreate_v2.argtypes = [ctypes.POINTER(p)]
            lib.cublasDestroy_v2.argtypes = [p]
            lib.cublasGemmEx.argtypes = [p, i, i, i, i, i, p, p, i, i, p, i, i, p, p, i, i, i, i]
        except AttributeError as exc:
            raise CudaError(f"{lib._name} lacks {exc}: cuBLAS 11 or newer is needed") from exc
        for function in (lib.cublasCreate_v2, lib.cublasDestroy_v2, lib.cublasGemmEx):
            function.restype = i
        self.lib = lib
        self._status_name = getattr(lib, "cublasGetStatusName", None)
        if self._status_name is not None:
            self._status_name.argtypes, self._status_name.restype = [i], ctypes.c_char_p

    def check(self, status: int, call: str) -> None:
        if status == 0:
            return
        name = CUBLAS_STATUS.get(status, "unknown cublasStatus")
        if self._status_name is not None:
            name = (self._status_name(status) or name.encode()).decode(errors="replace")
        raise CudaError(f"{call} failed: {name} ({status})")

    @contextmanager
    def handle(self) -> Iterator[ctypes.c_void_p]:
        handle = ctypes.c_void_p()
        self.check(self.lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate_v2")
        try:
            yield handle
        finally:
            self.lib.cublasDestroy_v2(handle)

    def gemm(
        self, handle: ctypes.c_void_p, n: int, kind: GemmType, matrices: tuple[int, int, int], scale: tuple
    ) -> None:
        """C = alpha A B + beta C, all n x n, column-major, no transposition; asynchronous."""
        (a, b, c), (alpha, beta) = matrices, scale
        t = kind.data_type
        status = self.lib.cublasGemmEx(
            handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, ctypes.byref(alpha), a, t, n, b, t, n,
            ctypes.byref(beta), c, t, n, kind.compute_type, CUBLAS_GEMM_DEFAULT,
        )  # fmt: skip
        self.check(status, "cublasGemmEx")


# ---------------------------------------------------------------------------------- measurements
@dataclass(frozen=True)
class Measurement:
    value: float  # tflops (gemm) or bytes per second (hbm)
    seconds: float  # the time measured over, warm-up excluded


class Backend(Protocol):
    """What measures: the CUDA backend on a node; a stand-in in tests (no GPU there). Methods raise
    :class:`CudaError` with a one-line reason when they cannot measure."""

    def prepare(self, test: str) -> None:
        """Load what ``test`` needs (cuBLAS for gemm) before any GPU starts."""

    def gpu_count(self) -> int: ...

    def gemm(self, gpu: int, dtype: str, size: int, seconds: float) -> Measurement: ...

    def hbm(self, gpu: int, nbytes: int, seconds: float) -> Measurement: ...


FILL_BLOCK = 4 << 20  # random bytes made on the host, copied over a matrix again and again
BATCH_SECONDS = 0.1  # GPU work queued between two synchronisations
MAX_BATCH = 10_000
WARMUP_SECONDS = 2.0  # clocks and power settle; at most a tenth of --seconds
ALIGN = 1 << 20


class CudaBackend:
    """Measures through the CUDA driver API (``libcuda.so.1``) and cuBLAS, one thread per GPU, each
    with its GPU's primary context current. Timing: the host's monotonic clock around batches of work
    followed by ``cuCtxSynchronize``, so the GPU never idles between calls of a batch."""

    def __init__(self, cublas: str | None = None) -> None:
        pci_bus_order()
        self.driver = CudaDriver()
        self.cublas_library = cublas
        self.blas: Cublas | None = None

    def prepare(self, test: str) -> None:
        if test == "gemm" and self.blas is None:
            self.blas = Cublas(self.cublas_library)

    def gpu_count(self) -> int:
        return self.driver.device_count()

    def _timed(self, step: Callable[[], None], seconds: float) -> tuple[int, float]:
        """(steps, elapsed) of ``step`` repeated for ``seconds`` after a warm-up."""
        sync, clock = self.driver.synchronize, time.perf_counter
        step()  # the first call loads kernels and picks cuBLAS's algorithm
        sync()
        started = clock()
        step()
        sync()
        batch = max(1, min(MAX_BATCH, int(BATCH_SECONDS / max(clock() - started, 1e-6))))
        warm_until = clock() + min(WARMUP_SECONDS, seconds / 10)
        while clock() < warm_until:
            for _ in range(batch):
                step()
            sync()
        steps, started = 0, clock()
        while True:
            for _ in range(batch):
                step()
            sync()
            steps += batch
            elapsed = clock() - started
            if elapsed >= seconds:
                return steps, elapsed

    def _fill_random(self, matrix: int, block: bytes, nbytes: int) -> None:
        for offset in range(0, nbytes, len(block)):
            self.driver.copy_to_device(matrix + offset, block, min(len(block), nbytes - offset))

    def gemm(self, gpu: int, dtype: str, size: int, seconds: float) -> Measurement:
        self.prepare("gemm")
        assert self.blas is not None
        blas, driver, kind = self.blas, self.driver, DTYPES[dtype]
        nbytes = size * size * kind.element_bytes
        block = random_elements(dtype, min(nbytes, FILL_BLOCK))
        with (
            driver.primary_context(gpu),
            blas.handle() as handle,
            driver.device_memory(nbytes) as a,
            driver.device_memory(nbytes) as b,
            driver.device_memory(nbytes) as c,
        ):
            self._fill_random(a, block, nbytes)
            self._fill_random(b, block[len(block) // 2 :] + block[: len(block) // 2], nbytes)
            driver.fill(c, 0, nbytes)
            scale = (ctypes.c_float(1.0), ctypes.c_float(0.0))
            steps, elapsed = self._timed(lambda: blas.gemm(handle, size, kind, (a, b, c), scale), seconds)
        return Measurement(2 * size**3 * steps / elapsed / 1e12, elapsed)

    def hbm(self, gpu: int, nbytes: int, seconds: float) -> Measurement:
        driver = self.driver
        with driver.primary_context(gpu):
            free, _ = driver.memory_info()
            size = min(nbytes, free // 4) // ALIGN * ALIGN
            if size <= 0:
                raise CudaError(f"cuMemGetInfo_v2: only {free} bytes free, too little to copy")
            with driver.device_memory(size) as source, driver.device_memory(size) as target:
                driver.fill(source, 0xA5, size)
                driver.fill(target, 0, size)
                steps, elapsed = self._timed(lambda: driver.copy_on_device(target, source, size), seconds)
        return Measurement(2 * size * steps / elapsed, elapsed)


# ---------------------------------------------------------------------------------- command line
def gpu_list(text: str) -> list[int]:
    try:
        gpus = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPU indices like 0,3, got {text!r}") from None
    if any(gpu < 0 for gpu in gpus) or len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"expected distinct GPU indices >= 0, got {text!r}")
    return gpus


def positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tests = parser.add_subparsers(dest="test", required=True, metavar="{gemm,hbm}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--seconds", type=positive(float), default=30.0, help="measured time (default 30)")
    common.add_argument("--gpus", type=gpu_list, help="GPU indices, e.g. 0,3 (default: every GPU)")
    gemm = tests.add_parser("gemm", parents=[common], help="matrix multiplication throughput (TFLOPS)")
    gemm.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="element type (default bf16)")
    gemm.add_argument("--size", type=positive(int), default=8192, help="matrix order n (default 8192)")
    gemm.add_argument("--cublas", metavar="LIBRARY", help="cuBLAS library to load (a soname or a path)")
    hbm = tests.add_parser("hbm", parents=[common], help="GPU memory copy bandwidth (bytes per second)")
    hbm.add_argument(
        "--buffer-mib", type=positive(int), default=2048, help="bytes copied per copy, in MiB (default 2048)"
    )
    return parser


def probe_line(args: argparse.Namespace, gpu: int, measured: Measurement) -> str:
    if args.test == "gemm":
        figure = f"dtype={args.dtype} tflops={measured.value:.1f}"
    else:
        figure = f"bytes_per_second={measured.value:.4g}"
    return f"{PREFIX} test={args.test} gpu={gpu} {figure} seconds={measured.seconds:.1f}"


def _complain(message: str) -> int:
    print(f"{PROGRAM}: {message}", file=sys.stderr, flush=True)
    return 2


def _measure(backend: Backend, args: argparse.Namespace, gpu: int) -> Measurement:
    if args.test == "gemm":
        return backend.gemm(gpu, args.dtype, args.size, args.seconds)
    return backend.hbm(gpu, args.buffer_mib << 20, args.seconds)


def main(argv: list[str] | None = None, backend: Backend | None = None) -> int:
    """Measure, print the probe lines; the exit status (argparse exits 2 itself on bad arguments)."""
    args = build_parser().parse_args(argv)
    try:
        if backend is None:
            backend = CudaBackend(getattr(args, "cublas", None))
        backend.prepare(args.test)
        count = backend.gpu_count()
    except CudaError as exc:
        return _complain(str(exc))
    if count <= 0:
        return _complain("the CUDA driver sees no GPU (CUDA_VISIBLE_DEVICES empty?)")
    gpus = args.gpus if args.gpus is not None else list(range(count))
    unknown = [gpu for gpu in gpus if gpu >= count]
    if unknown:
        listed = ",".join(map(str, unknown))
        return _complain(f"--gpus {listed}: no such GPU, this node has GPUs 0-{count - 1}")
    failures: list[str] = []
    with ThreadPoolExecutor(max_workers=len(gpus), thread_name_prefix="gpu") as pool:
        running = {pool.submit(_measure, backend, args, gpu): gpu for gpu in gpus}
        for future in as_completed(running):
            gpu = running[future]
            try:
                measured = future.result()
            except CudaError as exc:
                failures.append(f"GPU {gpu}: {exc}")
                continue
            print(probe_line(args, gpu, measured), flush=True)
    for failure in failures:
        _complain(failure)
    if failures:
        return 2
    print(f"{PREFIX} done gpus={len(gpus)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
