"""fleetsight-gpu-probe (checks/gpu_probe.py), which the catalogue's gemm_throughput and hbm_bandwidth run.

No GPU exists here, so three layers are tested apart:
- the real program as a subprocess on this machine (no libcuda): exit 2 naming libcuda, and the check
  reads that as a failed, unreadable result, through the runner as on a node;
- the command line with a stand-in measurement backend (the GPU only): lines the catalogue's parser
  accepts with the catalogue's own params, a slow GPU below the floor failing, --gpus, failures, bad
  arguments;
- the real CUDA backend (ctypes, threads, contexts, cuBLAS arguments) against stand-in ``libcuda.so.1``
  and ``libcublas.so.12`` compiled here from the C below: they implement the CUDA driver and cuBLAS
  signatures of cuda.h / cublas_api.h, refuse calls made without a current context or with wrong
  arguments, and log what they were asked; no GPU work is done, so their figures mean nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from checks import gpu_probe, parsers, runner
from checks.catalog import load_catalog
from fleetsight.cuda import CudaError
from fleetsight.settings import REPO_ROOT

CATALOG = load_catalog()
GEMM, HBM = CATALOG["gemm_throughput"], CATALOG["hbm_bandwidth"]


def probe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "checks.gpu_probe", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, env=env)


# ---------------------------------------------------------------------------------- this machine
def test_without_a_cuda_driver_the_probe_exits_2_naming_libcuda_and_the_check_fails_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No driver library, on any machine (a GPU node's own driver is not loaded): the probe and the
    # runner's child both read FLEETSIGHT_CUDA_LIBRARY.
    monkeypatch.setenv("FLEETSIGHT_CUDA_LIBRARY", str(tmp_path / "no-driver" / "libcuda.so.1"))
    done = probe("gemm", "--seconds", "1", env=dict(os.environ))
    assert done.returncode == 2, done
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "libcuda.so.1" in lines[0] and "Traceback" not in done.stderr
    verdict = parsers.probe_lines(done.stderr, GEMM.params)
    assert verdict.outcome == "unknown" and "unreadable" in verdict.summary
    assert "libcuda.so.1" in verdict.evidence["output_head"]

    # the same through the runner, as `fleetsight checks run` on a node, the probe as the tools file says
    tools = tmp_path / "tools.yml"
    tools.write_text(json.dumps({"tools": {"gpu_probe": [sys.executable, "-m", "checks.gpu_probe"]}}))
    for check in (GEMM, HBM):
        result = runner.run_check(check, "n0001", runner.load_tools(tools))
        assert result["outcome"] == "unknown", result
        assert "unreadable" in result["summary"] and "libcuda" in result["evidence"]["output_head"]


# ---------------------------------------------------------------------------------- stand-in backend
class FakeGpus:
    """The GPU side only: fixed figures per GPU, calls recorded, a failure where asked."""

    def __init__(self, count: int = 8, tflops: float = 700.0, bandwidth: float = 2.95e12) -> None:
        self.count, self.tflops, self.bandwidth = count, dict.fromkeys(range(count), tflops), bandwidth
        self.calls: list[tuple] = []
        self.failing: dict[int, str] = {}
        self.prepared: list[str] = []

    def prepare(self, test: str) -> None:
        self.prepared.append(test)

    def gpu_count(self) -> int:
        return self.count

    def gemm(self, gpu: int, dtype: str, size: int, seconds: float) -> gpu_probe.Measurement:
        self.calls.append(("gemm", gpu, dtype, size, seconds))
        if gpu in self.failing:
            raise CudaError(self.failing[gpu])
        return gpu_probe.Measurement(self.tflops[gpu], seconds + 0.04)

    def hbm(self, gpu: int, nbytes: int, seconds: float) -> gpu_probe.Measurement:
        self.calls.append(("hbm", gpu, nbytes, seconds))
        if gpu in self.failing:
            raise CudaError(self.failing[gpu])
        return gpu_probe.Measurement(self.bandwidth, seconds)


def run_main(capsys: pytest.CaptureFixture[str], args: list[str], gpus: FakeGpus) -> tuple[int, str, str]:
    status = gpu_probe.main(args, backend=gpus)
    out, err = capsys.readouterr()
    return status, out, err


def test_the_catalogues_own_arguments_give_lines_its_parser_passes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    gpus = FakeGpus()
    status, out, err = run_main(capsys, list(GEMM.args), gpus)
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert len(lines) == 9 and lines[-1] == "fleetsight-probe v1 done gpus=8"
    assert "fleetsight-probe v1 test=gemm gpu=0 dtype=bf16 tflops=700.0 seconds=30.0" in lines
    assert all(line.startswith(parsers.PROBE_PREFIX) for line in lines)
    verdict = parsers.probe_lines(out, GEMM.params)
    assert verdict.passed, verdict
    assert verdict.evidence["values"] == {str(g): 700.0 for g in range(8)}
    assert sorted(gpus.calls) == [("gemm", g, "bf16", 8192, 30.0) for g in range(8)]
    assert gpus.prepared == ["gemm"]

    status, out, _ = run_main(capsys, list(HBM.args), gpus)
    assert status == 0
    assert "fleetsight-probe v1 test=hbm gpu=7 bytes_per_second=2.95e+12 seconds=30.0" in out.splitlines()
    verdict = parsers.probe_lines(out, HBM.params)
    assert verdict.passed and verdict.evidence["values"]["3"] == 2.95e12
    assert ("hbm", 3, 2048 << 20, 30.0) in gpus.calls


def test_a_slow_gpu_below_the_floor_fails_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    gpus = FakeGpus()
    gpus.tflops[5] = 0.59 * float(GEMM.params["expected"])  # just under min_ratio 0.60 of 989
    status, out, _ = run_main(capsys, ["gemm", "--seconds", "1"], gpus)
    assert status == 0  # the probe measured; judging is the check's
    verdict = parsers.probe_lines(out, GEMM.params)
    assert verdict.outcome == "failed"
    assert verdict.summary.startswith("GPU 5 tflops 583.5 <")
    assert list(verdict.evidence["below_floor"]) == ["5"]

    slow_memory = FakeGpus(bandwidth=2.5e12)  # 0.75 of 3.35 TB/s, under min_ratio 0.80
    status, out, _ = run_main(capsys, ["hbm", "--seconds", "1"], slow_memory)
    verdict = parsers.probe_lines(out, HBM.params)
    assert status == 0 and verdict.outcome == "failed" and len(verdict.evidence["below_floor"]) == 8


def test_gpus_picks_the_gpus_and_the_closing_line_counts_them(capsys: pytest.CaptureFixture[str]) -> None:
    gpus = FakeGpus()
    args = ["gemm", "--gpus", "0,3", "--dtype", "fp16", "--size", "4096", "--seconds", "2.5"]
    status, out, _ = run_main(capsys, args, gpus)
    assert status == 0
    assert sorted(gpus.calls) == [("gemm", 0, "fp16", 4096, 2.5), ("gemm", 3, "fp16", 4096, 2.5)]
    lines = out.splitlines()
    assert sorted(lines[:2]) == [
        "fleetsight-probe v1 test=gemm gpu=0 dtype=fp16 tflops=700.0 seconds=2.5",
        "fleetsight-probe v1 test=gemm gpu=3 dtype=fp16 tflops=700.0 seconds=2.5",
    ]
    assert lines[2:] == ["fleetsight-probe v1 done gpus=2"]
    verdict = parsers.probe_lines(out, GEMM.params)
    assert verdict.passed and set(verdict.evidence["values"]) == {"0", "3"}

    status, out, _ = run_main(capsys, ["hbm", "--gpus", "1", "--buffer-mib", "512", "--seconds", "1"], gpus)
    assert status == 0 and gpus.calls[-1] == ("hbm", 1, 512 << 20, 1.0)


def test_a_gpu_the_node_lacks_is_an_error_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    gpus = FakeGpus(count=4)
    status, out, err = run_main(capsys, ["gemm", "--gpus", "0,4,6"], gpus)
    assert status == 2 and out == "" and gpus.calls == []
    assert err == "fleetsight-gpu-probe: --gpus 4,6: no such GPU, this node has GPUs 0-3\n"

    status, out, err = run_main(capsys, ["hbm"], FakeGpus(count=0))
    assert status == 2 and out == "" and "sees no GPU" in err


def test_a_failing_gpu_exits_2_without_the_closing_line_and_the_check_says_unreadable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    gpus = FakeGpus(count=4)
    gpus.failing[2] = "cublasGemmEx failed: CUBLAS_STATUS_EXECUTION_FAILED (13)"
    status, out, err = run_main(capsys, ["gemm", "--seconds", "1"], gpus)
    assert status == 2
    assert err == "fleetsight-gpu-probe: GPU 2: cublasGemmEx failed: CUBLAS_STATUS_EXECUTION_FAILED (13)\n"
    assert sorted(out.splitlines()) == [
        f"fleetsight-probe v1 test=gemm gpu={g} dtype=bf16 tflops=700.0 seconds=1.0" for g in (0, 1, 3)
    ]
    verdict = parsers.probe_lines(out, GEMM.params)
    assert verdict.outcome == "unknown" and "no closing 'done' line" in verdict.summary


class Unloadable(FakeGpus):
    def prepare(self, test: str) -> None:
        raise CudaError("cannot load cuBLAS (libcublas.so.12: cannot open shared object file)")


def test_a_library_that_does_not_load_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    gpus = Unloadable()
    status, out, err = run_main(capsys, ["gemm"], gpus)
    assert (status, out, gpus.calls) == (2, "", [])
    assert (
        err == "fleetsight-gpu-probe: cannot load cuBLAS (libcublas.so.12: cannot open shared object file)\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the following arguments are required"),
        (["flops"], "invalid choice: 'flops'"),
        (["gemm", "--dtype", "int4"], "invalid choice: 'int4'"),
        (["gemm", "--seconds", "0"], "expected a number > 0, got '0'"),
        (["hbm", "--seconds", "soon"], "expected a number, got 'soon'"),
        (["gemm", "--gpus", "a,b"], "expected GPU indices like 0,3, got 'a,b'"),
        (["hbm", "--gpus", "1,1"], "expected distinct GPU indices >= 0, got '1,1'"),
        (["hbm", "--gpus=-1"], "expected distinct GPU indices >= 0, got '-1'"),
        (["hbm", "--size", "4096"], "unrecognized arguments: --size 4096"),
        (["gemm", "--size", "1.5"], "expected a number, got '1.5'"),
    ],
)
def test_bad_arguments_are_argparse_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = FakeGpus()
    with pytest.raises(SystemExit) as exit_info:
        gpu_probe.main(args, backend=gpus)
    assert exit_info.value.code == 2 and gpus.calls == []
    err = capsys.readouterr().err
    assert "usage: fleetsight-gpu-probe" in err and message in err


def test_help_teaches_what_is_measured_and_against_what() -> None:
    done = probe("--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for phrase in (
        "cublasGemmEx",
        "tflops = 2 n^3",
        "bytes_per_second = 2 x bytes copied / seconds",
        "989 TFLOPS dense",
        "HBM3 3.35 TB/s",
        "min_ratio",
        "fleetsight-probe v1 done gpus=8",
        "exit 0 when every gpu was measured",
    ):
        assert phrase.lower() in text.lower(), phrase
    gemm_help = " ".join(probe("gemm", "--help").stdout.split())
    assert "--dtype {bf16,fp16,tf32}" in gemm_help and "--gpus" in gemm_help and "--seconds" in gemm_help


def test_random_elements_are_finite_and_bounded_for_every_dtype() -> None:
    """What the GEMM multiplies: no NaN/Inf/subnormal, 2^-7 <= |x| < 2, both signs, not constant."""
    decode = {
        "bf16": lambda raw: [struct.unpack("<f", b"\0\0" + raw[i : i + 2])[0] for i in range(0, len(raw), 2)],
        "fp16": lambda raw: list(struct.unpack(f"<{len(raw) // 2}e", raw)),
        "tf32": lambda raw: list(struct.unpack(f"<{len(raw) // 4}f", raw)),
    }
    for dtype, read in decode.items():
        values = read(gpu_probe.random_elements(dtype, 1 << 16))
        assert len(values) == (1 << 16) // gpu_probe.DTYPES[dtype].element_bytes
        assert all(2**-7 <= abs(v) < 2 for v in values), dtype
        assert min(values) < -1 and max(values) > 1 and len(set(values)) >= 1000, (
            dtype
        )  # bf16 has 2 x 8 x 128 values in range


# ---------------------------------------------------------------------------------- stand-in libraries
FAKE_CUDA = r"""
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static __thread int current = -1; /* the device whose context is current on this thread */
static __thread size_t logged_copy = 0;
static int initialised = 0;
static unsigned long long next_pointer = 0x7f0000000000ULL;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

void fake_note(const char *format, ...) {
    const char *path = getenv("FAKE_CUDA_LOG");
    if (!path) return;
    pthread_mutex_lock(&lock);
    FILE *log = fopen(path, "a");
    va_list args;
    va_start(args, format);
    vfprintf(log, format, args);
    va_end(args);
    fputc('\n', log);
    fclose(log);
    pthread_mutex_unlock(&lock);
}

static int gpus(void) { const char *n = getenv("FAKE_CUDA_GPUS"); return n ? atoi(n) : 2; }
static int failing(const char *call) {
    const char *f = getenv("FAKE_CUDA_FAIL");
    return f && !strcmp(f, call);
}
#define NEED_CONTEXT if (current < 0) return 201

CUresult cuInit(unsigned int flags) {
    if (flags != 0) return 1;
    if (gpus() == 0) return 100;
    const char *order = getenv("CUDA_DEVICE_ORDER");
    fake_note("cuInit order=%s", order ? order : "-");
    initialised = 1;
    return 0;
}
CUresult cuGetErrorName(CUresult error, const char **name) {
    switch (error) {
    case 0: *name = "CUDA_SUCCESS"; return 0;
    case 1: *name = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 2: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 3: *name = "CUDA_ERROR_NOT_INITIALIZED"; return 0;
    case 100: *name = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 101: *name = "CUDA_ERROR_INVALID_DEVICE"; return 0;
    case 201: *name = "CUDA_ERROR_INVALID_CONTEXT"; return 0;
    case 700: *name = "CUDA_ERROR_ILLEGAL_ADDRESS"; return 0;
    }
    *name = NULL;
    return 1;
}
CUresult cuDeviceGetCount(int *count) { if (!initialised) return 3; *count = gpus(); return 0; }
CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialised) return 3;
    if (ordinal < 0 || ordinal >= gpus()) return 101;
    *device = ordinal;
    return 0;
}
CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice device) {
    if (device < 0 || device >= gpus()) return 101;
    snprintf(bus_id, len, "0000:%02X:00.0", 0x18 + 0x10 * device);
    return 0;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
    if (device < 0 || device >= gpus()) return 101;
    *context = (CUcontext)(intptr_t)(0x1000 + device);
    return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) { return device >= 0 && device < gpus() ? 0 : 101; }
CUresult cuCtxSetCurrent(CUcontext context) {
    current = context ? (int)((intptr_t)context - 0x1000) : -1;
    return 0;
}
CUresult cuCtxGetCurrent(CUcontext *context) {
    *context = current < 0 ? NULL : (CUcontext)(intptr_t)(0x1000 + current);
    return 0;
}
CUresult cuCtxSynchronize(void) { NEED_CONTEXT; return failing("cuCtxSynchronize") ? 700 : 0; }
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    NEED_CONTEXT;
    const char *free_env = getenv("FAKE_CUDA_FREE");
    *total = 80ULL << 30;
    *free_bytes = free_env ? strtoull(free_env, NULL, 10) : 79ULL << 30;
    return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t bytes) {
    NEED_CONTEXT;
    if (bytes == 0) return 1;
    if (failing("cuMemAlloc_v2")) return 2;
    pthread_mutex_lock(&lock);
    *pointer = next_pointer;
    next_pointer += ((bytes + 0xFFFFF) & ~0xFFFFFULL) + 0x100000;
    pthread_mutex_unlock(&lock);
    fake_note("alloc gpu=%d bytes=%zu", current, bytes);
    return 0;
}
CUresult cuMemFree_v2(CUdeviceptr pointer) {
    NEED_CONTEXT;
    fake_note("free gpu=%d", current);
    return pointer ? 0 : 1;
}
CUresult cuMemAllocHost_v2(void **pointer, size_t bytes) {
    NEED_CONTEXT;
    *pointer = malloc(bytes);
    return *pointer ? 0 : 2;
}
CUresult cuMemFreeHost(void *pointer) { free(pointer); return 0; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr target, const void *source, size_t bytes) {
    NEED_CONTEXT;
    if (!target || !source || !bytes) return 1;
    volatile unsigned char sum = ((const unsigned char *)source)[bytes - 1]; /* a bad pointer crashes */
    (void)sum;
    return 0;
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr target, CUdeviceptr source, size_t bytes) {
    NEED_CONTEXT;
    if (!target || !source || target == source || !bytes) return 1;
    if (logged_copy != bytes) fake_note("dtod gpu=%d bytes=%zu", current, bytes);
    logged_copy = bytes;
    usleep(100);
    return 0;
}
CUresult cuMemsetD8_v2(CUdeviceptr target, unsigned char value, size_t bytes) {
    NEED_CONTEXT;
    if (!target || !bytes) return 1;
    fake_note("memset gpu=%d value=%u bytes=%zu", current, value, bytes);
    return 0;
}
"""

FAKE_CUBLAS = r"""
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

int cuCtxGetCurrent(void **context);
void fake_note(const char *format, ...);
static __thread int logged = 0;

static int device(void) {
    void *context = 0;
    cuCtxGetCurrent(&context);
    return context ? (int)((intptr_t)context - 0x1000) : -1;
}

int cublasCreate_v2(int **handle) {
    if (device() < 0) return 1; /* CUBLAS_STATUS_NOT_INITIALIZED: no context to bind to */
    *handle = malloc(sizeof(int));
    **handle = device();
    fake_note("cublasCreate gpu=%d", **handle);
    return 0;
}
int cublasDestroy_v2(int *handle) { fake_note("cublasDestroy gpu=%d", *handle); free(handle); return 0; }
const char *cublasGetStatusName(int status) {
    if (status == 13) return "CUBLAS_STATUS_EXECUTION_FAILED";
    return status == 7 ? "CUBLAS_STATUS_INVALID_VALUE" : "?";
}
int cublasGemmEx(int *handle, int transa, int transb, int m, int n, int k, const void *alpha,
                 const void *a, int atype, int lda, const void *b, int btype, int ldb, const void *beta,
                 void *c, int ctype, int ldc, int compute, int algo) {
    if (!handle || *handle != device()) return 14; /* the handle's GPU is not the current one */
    if (getenv("FAKE_CUBLAS_FAIL")) return 13;
    if (m <= 0 || n <= 0 || k <= 0 || lda < m || ldb < k || ldc < m) return 7;
    if (!a || !b || !c || a == c || b == c || !alpha || !beta) return 7;
    if (atype != btype || btype != ctype || (compute != 68 && compute != 77)) return 7;
    if (algo < -1 || algo > 23) return 7;
    if (!logged) {
        fake_note("gemm gpu=%d op=%d,%d m=%d n=%d k=%d types=%d,%d,%d ld=%d,%d,%d compute=%d algo=%d "
                  "alpha=%g beta=%g",
                  *handle, transa, transb, m, n, k, atype, btype, ctype, lda, ldb, ldc, compute, algo,
                  *(const float *)alpha, *(const float *)beta);
        logged = 1;
    }
    usleep(100);
    return 0;
}
"""


@pytest.fixture(scope="module")
def fake_libraries(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the stand-in libcuda.so.1 and libcublas.so.12 (sonames as NVIDIA's)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.fail("no C compiler (cc) to build the stand-in CUDA libraries: apt-get install gcc")
    folder = tmp_path_factory.mktemp("fake-cuda")
    (folder / "cuda.c").write_text(FAKE_CUDA)
    (folder / "cublas.c").write_text(FAKE_CUBLAS)
    build = [compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-Wno-unused-but-set-variable"]
    subprocess.run(
        [*build, "-Wl,-soname,libcuda.so.1", "-o", str(folder / "libcuda.so.1"), str(folder / "cuda.c"),
         "-lpthread"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    subprocess.run(
        [*build, "-o", str(folder / "libcublas.so.12"), str(folder / "cublas.c"), f"-L{folder}",
         "-l:libcuda.so.1", f"-Wl,-rpath,{folder}"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return folder


def fake_env(folder: Path, log: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "CUDA_"))}
    return {**env, "LD_LIBRARY_PATH": str(folder), "FAKE_CUDA_LOG": str(log), **extra}


def logged(log: Path, word: str) -> list[str]:
    return sorted(line for line in log.read_text().splitlines() if line.startswith(word + " "))


@pytest.mark.parametrize(
    ("dtype", "types", "compute"), [("bf16", "14,14,14", 68), ("fp16", "2,2,2", 68), ("tf32", "0,0,0", 77)]
)
def test_the_cuda_backend_drives_cublas_on_every_gpu_with_its_own_context(
    fake_libraries: Path, tmp_path: Path, dtype: str, types: str, compute: int
) -> None:
    log = tmp_path / "calls.log"
    done = probe(
        "gemm", "--dtype", dtype, "--size", "256", "--seconds", "0.3", env=fake_env(fake_libraries, log)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "fleetsight-probe v1 done gpus=2"
    verdict = parsers.probe_lines(done.stdout, {"metric": "tflops", "expected": 1e-9, "min_ratio": 1.0})
    assert verdict.passed and set(verdict.evidence["values"]) == {"0", "1"}, verdict
    assert logged(log, "cuInit") == ["cuInit order=PCI_BUS_ID"]  # numbered as nvidia-smi numbers them
    assert logged(log, "gemm") == [
        f"gemm gpu={gpu} op=0,0 m=256 n=256 k=256 types={types} ld=256,256,256 compute={compute} algo=-1 "
        "alpha=1 beta=0"
        for gpu in (0, 1)
    ]
    element = 4 if dtype == "tf32" else 2
    assert logged(log, "alloc") == [
        f"alloc gpu={gpu} bytes={256 * 256 * element}" for gpu in (0, 0, 0, 1, 1, 1)
    ]
    assert len(logged(log, "free")) == 6 and logged(log, "cublasDestroy") == [
        "cublasDestroy gpu=0",
        "cublasDestroy gpu=1",
    ]


def test_the_cuda_backend_copies_a_quarter_of_free_memory_at_most_and_needs_no_cublas(
    fake_libraries: Path, tmp_path: Path
) -> None:
    driver_only = tmp_path / "driver-only"
    driver_only.mkdir()
    shutil.copy(fake_libraries / "libcuda.so.1", driver_only)
    log = tmp_path / "calls.log"
    env = fake_env(driver_only, log, FAKE_CUDA_GPUS="3", FAKE_CUDA_FREE=str(3 << 30))
    done = probe("hbm", "--gpus", "0,2", "--seconds", "0.3", env=env)
    assert done.returncode == 0, done.stderr
    verdict = parsers.probe_lines(
        done.stdout, {"metric": "bytes_per_second", "expected": 1.0, "min_ratio": 1.0}
    )
    assert verdict.passed and set(verdict.evidence["values"]) == {"0", "2"}
    quarter = (3 << 30) // 4  # 768 MiB of each buffer, less than the default 2 GiB
    assert logged(log, "dtod") == [f"dtod gpu=0 bytes={quarter}", f"dtod gpu=2 bytes={quarter}"]
    assert logged(log, "memset") == sorted(
        f"memset gpu={gpu} value={value} bytes={quarter}" for gpu in (0, 2) for value in (0, 165)
    )

    done = probe("gemm", "--seconds", "0.3", env=env)  # the same node without cuBLAS
    assert done.returncode == 2 and done.stdout == ""
    assert (
        done.stderr.startswith("fleetsight-gpu-probe: cannot load cuBLAS")
        and "libcublas.so.12" in done.stderr
    )


GEMM_ARGS, HBM_ARGS = ["gemm", "--size", "256", "--seconds", "0.3"], ["hbm", "--seconds", "0.3"]


@pytest.mark.parametrize(
    ("args", "extra", "message"),
    [
        (HBM_ARGS, {"FAKE_CUDA_FAIL": "cuMemAlloc_v2"}, "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (2)"),
        (
            GEMM_ARGS,
            {"FAKE_CUDA_FAIL": "cuCtxSynchronize"},
            "cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)",
        ),
        (GEMM_ARGS, {"FAKE_CUBLAS_FAIL": "1"}, "cublasGemmEx failed: CUBLAS_STATUS_EXECUTION_FAILED (13)"),
        (
            HBM_ARGS,
            {"FAKE_CUDA_FREE": str(1 << 20)},
            "cuMemGetInfo_v2: only 1048576 bytes free, too little to copy",
        ),
    ],
)
def test_a_failed_call_is_named_with_its_status_on_every_gpu_and_exit_2(
    fake_libraries: Path, tmp_path: Path, args: list[str], extra: dict[str, str], message: str
) -> None:
    done = probe(*args, env=fake_env(fake_libraries, tmp_path / "calls.log", **extra))
    assert done.returncode == 2 and done.stdout == "", done
    assert sorted(done.stderr.splitlines()) == [
        f"fleetsight-gpu-probe: GPU {gpu}: {message}" for gpu in (0, 1)
    ]
    assert parsers.probe_lines(done.stdout or done.stderr, GEMM.params).outcome == "unknown"


def test_no_device_is_cuinits_own_error(fake_libraries: Path, tmp_path: Path) -> None:
    done = probe("hbm", env=fake_env(fake_libraries, tmp_path / "calls.log", FAKE_CUDA_GPUS="0"))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "fleetsight-gpu-probe: cuInit failed: CUDA_ERROR_NO_DEVICE (100)\n"


def test_the_node_agents_pcie_probe_runs_on_the_shared_driver_helper(
    fake_libraries: Path, tmp_path: Path
) -> None:
    """exporters/probes.py measures through fleetsight.cuda too: bus ids, pinned memory, a context per GPU."""
    code = (
        "import json; from exporters.probes import CudaBandwidthProbe; "
        "print(json.dumps(CudaBandwidthProbe().measure()))"
    )
    log = tmp_path / "calls.log"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
        env=fake_env(fake_libraries, log),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    gpus = json.loads(done.stdout)
    assert [gpu["pci_bdf"] for gpu in gpus] == ["0000:18:00.0", "0000:28:00.0"]
    assert all(gpu["host_to_device_bytes_per_second"] > 0 for gpu in gpus)
    assert logged(log, "alloc") == [f"alloc gpu={gpu} bytes={256 << 20}" for gpu in (0, 1)]
    assert len(logged(log, "free")) == 2


def test_the_wheel_installs_the_command_and_it_measures(fake_libraries: Path, tmp_path: Path) -> None:
    """The wheel installs checks/ as fleetsight_checks (pyproject's wheel sources): the command
    `fleetsight-gpu-probe` must import from there, with no dependency beyond the core package."""
    uv = [sys.executable, "-m", "uv"]
    build = [*uv, "build", "--wheel", "-q", "--out-dir", str(tmp_path / "dist"), str(REPO_ROOT)]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    venv = tmp_path / "venv"
    subprocess.run(
        [*uv, "venv", "-q", "--python", sys.executable, str(venv)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    wheel = str(next((tmp_path / "dist").glob("fleetsight-*.whl")))
    install = [*uv, "pip", "install", "-q", "--no-deps", "--python", str(venv / "bin" / "python"), wheel]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    command = [str(venv / "bin" / "fleetsight-gpu-probe"), "hbm", "--seconds", "0.2"]
    env = fake_env(fake_libraries, tmp_path / "calls.log")
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd="/", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "fleetsight-probe v1 done gpus=2"


def test_the_console_script_launcher_finds_the_probe_in_a_checkout() -> None:
    """pyproject's fleetsight-gpu-probe names fleetsight.launchers:gpu_probe, which imports checks/ as a
    checkout (an editable install) has it when there is no fleetsight_checks (the wheel's name)."""
    code = (
        "import sys; from fleetsight.launchers import gpu_probe; "
        "sys.argv[0] = 'fleetsight-gpu-probe'; gpu_probe()"
    )
    done = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, timeout=60,
                          cwd=REPO_ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: fleetsight-gpu-probe")
