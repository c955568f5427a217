"""The device a rank trains on, the precision ``auto`` resolves to there, its peak FLOP/s for MFU, how many
loader workers it gets (the CPUs a process may use, and the rule every ``-1`` worker count follows, serve the
pretokenize stage's decode workers too), and a block in which the CPU treats subnormal floats as zero for training.
The allocator setting that keeps freed memory for reuse is :mod:`fourm_kfp.allocator` (no torch: steps that
compute no tensor use it too).

bf16 autocast on CUDA and on CPUs with native bf16 (AVX512-BF16 or AMX); fp32 elsewhere: on AVX2-only CPUs a bf16
matmul runs ~50x slower than fp32 (a 1024² matmul measured 0.9 GFLOP/s in bf16 against 46 GFLOP/s in fp32, torch
2.13 on 2 threads). Peak FLOP/s: the vendor's dense bf16/fp32 figure for known GPUs, else a short matmul measured
on this device (so CPU MFU is "fraction of what this machine's matmul reaches").
"""

from __future__ import annotations

import ctypes
import os
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import torch

#: Dense peak FLOP/s by device-name fragment: (bf16, fp32 via TF32).
GPU_PEAKS = {"H200": (989e12, 494e12), "H100": (989e12, 494e12), "A100": (312e12, 156e12),
             "L40S": (362e12, 183e12), "A10": (125e12, 62.5e12)}


def training_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


#: The most loader worker processes ``train.loader_workers: -1`` gives a rank.
MAX_AUTO_LOADER_WORKERS = 14


#: Whole CPUs the pod requested (the job templates set it through the downward API).
CPU_REQUEST_ENV = "FOURM_CPU_REQUEST"


def available_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may use: its affinity, capped by a cgroup CPU quota (a Kubernetes CPU limit sets one
    without pinning cores, so the affinity alone would count every core of the node) and by the pod's CPU request
    where the job says it (``$FOURM_CPU_REQUEST``)."""
    count = len(os.sched_getaffinity(0))
    request = os.environ.get(CPU_REQUEST_ENV, "")
    if request.isdigit() and int(request) > 0:
        count = min(count, int(request))
    quota = None
    try:
        limit, period = (cgroup / "cpu.max").read_text().split()[:2]  # cgroup v2: "max 100000" or "400000 100000"
        quota = None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        try:  # cgroup v1
            limit = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
            quota = limit / int((cgroup / "cpu" / "cpu.cfs_period_us").read_text()) if limit > 0 else None
        except (OSError, ValueError):
            pass
    return max(1, min(count, int(quota))) if quota else count


def spare_cpu_workers(cpus: int, cap: int) -> int:
    """Worker processes beside a busy main process on ``cpus`` CPUs: one per CPU less the main one's, at least one,
    at most ``cap`` (the rule of every ``-1`` worker count: ``train.loader_workers``,
    ``pretokenize.decode_workers``)."""
    return max(1, min(cap, cpus - 1))


def loader_workers(setting: int, device: torch.device, cpus: int | None = None) -> int:
    """``train.loader_workers``; ``-1``: on a GPU the CPUs of each local rank less one (for the training process), at
    most :data:`MAX_AUTO_LOADER_WORKERS`, so the loader keeps up with the step; on the CPU one (the step itself
    needs the cores)."""
    if setting >= 0:
        return setting
    if device.type != "cuda":
        return 1
    per_rank = (cpus or available_cpus()) // max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)
    return spare_cpu_workers(per_rank, MAX_AUTO_LOADER_WORKERS)


#: CPU flags (Linux ``/proc/cpuinfo``) of hardware bf16 arithmetic.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as the Linux kernel lists them (empty where there is no ``/proc/cpuinfo``)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 arithmetic (AVX512-BF16 or AMX-BF16). torch's capability string names the vector
    ISA its kernels dispatch to, and says "AVX512" on a Zen 4 with ``avx512_bf16``, where a bf16 matmul runs at
    2.4x the fp32 rate (430 against 179 GFLOP/s on 2 threads), so the CPU's own flags decide."""
    capability = torch.backends.cpu.get_cpu_capability()
    return "BF16" in capability or "AMX" in capability or bool(cpu_flags() & NATIVE_BF16_FLAGS)


def resolve_precision(setting: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype (``None``: plain fp32) for a ``precision`` setting on ``device``."""
    if setting == "fp32":
        return None
    if setting == "bf16":
        return torch.bfloat16
    native = torch.cuda.is_bf16_supported() if device.type == "cuda" else cpu_has_native_bf16()
    return torch.bfloat16 if native else None


@lru_cache(maxsize=None)
def measured_matmul_flops(device_type: str, dtype: torch.dtype = torch.float32, size: int = 1024,
                          reps: int = 10) -> float:
    """FLOP/s of a large square matmul on this device (``reps`` repetitions after a warm-up)."""
    device = torch.device(device_type)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 2 * size**3 * reps / (time.perf_counter() - start)


def cpu_matmul_rate(size: int = 2048, trials: int = 3, reps: int = 10) -> dict[str, float]:
    """This machine's fp32 matmul rate on the CPU (the best of ``trials`` timings of ``reps`` square matmuls of side
    ``size``), its bf16 rate where the CPU has bf16 arithmetic (``precision: auto`` trains in bf16 there), and the
    threads torch uses: the yardstick printed beside a run's times, since 2-core machines differ up to 2x."""
    def gflops(dtype: torch.dtype) -> float:
        return round(max(measured_matmul_flops.__wrapped__("cpu", dtype, size, reps) for _ in range(trials)) / 1e9, 1)

    rate = {"fp32_matmul_gflops": gflops(torch.float32), "threads": torch.get_num_threads(), "matmul_side": size}
    if cpu_has_native_bf16():  # where precision auto trains in bf16, that rate too
        rate["bf16_matmul_gflops"] = gflops(torch.bfloat16)
    return rate


def peak_flops(device: torch.device, dtype: torch.dtype | None) -> float:
    """Peak FLOP/s for MFU: the known GPU's dense figure, else this device's measured matmul."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for fragment, (bf16, fp32) in GPU_PEAKS.items():
            if fragment in name:
                return bf16 if dtype == torch.bfloat16 else fp32
    return measured_matmul_flops(device.type, dtype or torch.float32)


#: Why training on a CUDA device is not bitwise reproducible (the manifest's ``nondeterminism``).
CUDA_TRAINING_NONDETERMINISM = (
    "trained on CUDA: backward kernels that accumulate with atomic adds (embedding and index_add gradients, "
    "scaled_dot_product_attention's fused backward) sum in a different order from run to run")


def training_nondeterminism(device: torch.device | str) -> list[str]:
    """Reasons a stage that trains on ``device`` commits different bytes from run to run (none on the CPU, where
    every kernel we use is deterministic for a fixed thread count)."""
    return [CUDA_TRAINING_NONDETERMINISM] if torch.device(device).type == "cuda" else []


@lru_cache(maxsize=None)
def _libgomp_path() -> str | None:
    """The GNU OpenMP runtime torch's CPU kernels run their worker team on, when this process loaded it."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) >= 6 and "libgomp" in Path(fields[5]).name:
            return fields[5]
    return None


def _set_flush_denormal_on_every_thread(flag: bool) -> None:
    """Set the subnormals-as-zero flag on the calling thread and on every thread of its OpenMP team (where torch's
    intra-op kernels run); on the calling thread only where torch is not built on libgomp."""
    torch.set_flush_denormal(flag)
    path = _libgomp_path()
    if path is None or torch.get_num_threads() <= 1:
        return
    gomp = ctypes.CDLL(path)
    body_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    body = body_type(lambda _data: torch.set_flush_denormal(flag))
    gomp.GOMP_parallel.argtypes = [body_type, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    gomp.GOMP_parallel.restype = None
    gomp.GOMP_parallel(body, None, torch.get_num_threads(), 0)  # the same team torch's kernels run on


@contextmanager
def flush_denormals(device: str | torch.device) -> Iterator[None]:
    """On the CPU, treat subnormal floats as zero inside the block, on this thread and all of torch's workers.

    A training whose values drift into the subnormal range otherwise slows down several-fold on x86 (the demo's
    edge tokenizer alone, 2400 steps: 120 s without, 47 s with, the same losses to four digits). The flag is per
    thread, and torch's OpenMP workers already exist, so setting it on the calling thread alone would leave half
    of every kernel IEEE; it is set through one OpenMP parallel region on the team torch's kernels run on, and
    cleared the same way on exit (IEEE behaviour everywhere else is untouched). The work stays on the calling
    thread: OpenMP regions launched from any other thread cost several times more. CUDA flushes in its own kernels
    as compiled: there the block runs as it is."""
    if torch.device(device).type != "cpu":
        yield
        return
    _set_flush_denormal_on_every_thread(True)
    try:
        yield
    finally:
        _set_flush_denormal_on_every_thread(False)
