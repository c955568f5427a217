"""How many loader workers a rank gets: the setting when given; with -1, on a GPU the CPUs per local rank less one
(a cgroup CPU quota, as a Kubernetes CPU limit sets, and the pod's CPU request count over the affinity), at most
14; on the CPU one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from fourm_kfp.hardware import MAX_AUTO_LOADER_WORKERS, available_cpus, loader_workers
from tests.torch_threads import torch_threads

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


def test_a_given_setting_is_kept():
    assert loader_workers(3, CUDA, cpus=64) == 3 and loader_workers(0, CPU) == 0


@pytest.mark.parametrize("cpus,local_ranks,expected", [
    (16, 1, MAX_AUTO_LOADER_WORKERS),  # the device machine: 16 cores, one GPU
    (8, 1, 7),
    (96, 8, 11),  # an 8-GPU node: 12 CPUs per rank
    (4, 8, 1),  # fewer CPUs than ranks: still one worker
])
def test_auto_on_a_gpu_shares_the_cpus_among_local_ranks(monkeypatch, cpus, local_ranks, expected):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_ranks))
    assert loader_workers(-1, CUDA, cpus=cpus) == expected


def test_auto_on_the_cpu_is_one_worker():
    assert loader_workers(-1, CPU, cpus=64) == 1


@pytest.mark.parametrize("files,expected", [
    ({"cpu.max": "400000 100000\n"}, 4),  # cgroup v2 quota of 4 CPUs
    ({"cpu.max": "150000 100000\n"}, 1),  # 1.5 CPUs: whole CPUs only
    ({"cpu.max": "max 100000\n"}, None),  # no quota: the affinity
    ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2),  # cgroup v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),
])
def test_available_cpus_honours_a_cgroup_quota(tmp_path, monkeypatch, files, expected):
    monkeypatch.delenv("FOURM_CPU_REQUEST", raising=False)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    affinity = len(os.sched_getaffinity(0))
    assert available_cpus(tmp_path) == (min(expected, affinity) if expected else affinity)


def test_available_cpus_honours_the_pods_cpu_request(tmp_path, monkeypatch):
    monkeypatch.setenv("FOURM_CPU_REQUEST", "1")  # as the job templates' downward API sets it
    assert available_cpus(tmp_path) == 1
    monkeypatch.setenv("FOURM_CPU_REQUEST", "0")  # no request: not a limit
    assert available_cpus(tmp_path) == len(os.sched_getaffinity(0))


@pytest.fixture
def two_threads():
    """torch's kernels on a team of two threads, whatever share of the CPUs this test process was given."""
    with torch_threads(2):
        yield


def test_subnormals_count_as_zero_in_every_thread_inside_the_block_and_ieee_resumes_after(two_threads):
    from fourm_kfp.hardware import flush_denormals

    many = torch.full((1 << 18,), 1e-40)  # subnormal in float32; large enough for torch to split across threads
    torch.mul(many, 1.0)  # torch's worker threads exist before the block starts
    assert bool((many * 1.0 != 0).all())
    with flush_denormals("cpu"):
        flushed = many * 1.0
    assert int((flushed == 0).sum()) == many.numel(), "some of torch's threads kept IEEE subnormals"
    assert bool((many * 1.0 != 0).all())  # every thread is back to IEEE after the block


def test_the_flush_ends_when_the_block_raises():
    from fourm_kfp.hardware import flush_denormals

    many = torch.full((1 << 18,), 1e-40)
    with pytest.raises(KeyError, match="inside"):
        with flush_denormals("cpu"):
            raise KeyError("inside")
    assert bool((many * 1.0 != 0).all())


@pytest.mark.parametrize("capability,flags,expected", [
    ("AVX512", {"avx512f", "avx512_bf16"}, True),  # a Zen 4: torch says AVX512, the CPU does bf16
    ("AVX512", {"avx512f", "amx_bf16", "amx_tile"}, True),  # a Sapphire Rapids
    ("AVX512", {"avx512f", "avx512bw"}, False),  # AVX512 without bf16 arithmetic
    ("AVX2", {"avx2", "fma"}, False),  # the trap: bf16 emulated, ~50x slower than fp32 (0.9 against 46 GFLOP/s)
    ("AVX512_BF16", set(), True),  # where torch names it, no flags needed
])
def test_precision_auto_picks_bf16_on_cpus_with_bf16_arithmetic(monkeypatch, capability, flags, expected):
    from fourm_kfp import hardware

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
    assert hardware.cpu_has_native_bf16() is expected
    assert hardware.resolve_precision("auto", CPU) == (torch.bfloat16 if expected else None)
    assert hardware.resolve_precision("fp32", CPU) is None


def test_cpu_flags_are_the_kernel_s_list():
    from fourm_kfp.hardware import cpu_flags

    flags = cpu_flags()
    if not os.path.exists("/proc/cpuinfo"):
        assert flags == frozenset()
    else:  # every x86-64 CPU has SSE2 (an ARM lists fp/asimd)
        assert "sse2" in flags or "fp" in flags


_FAULTS_OF_FRESH_BLOCKS = """
import ctypes, resource, sys, torch
from fourm_kfp.allocator import reuse_freed_memory
try:  # glibc's initial thresholds, made fixed (its dynamic threshold makes the default's faults vary run to run)
    mallopt = ctypes.CDLL(None).mallopt
except AttributeError:
    print("unsupported"); raise SystemExit
mallopt(-3, 128 << 10); mallopt(-1, 128 << 10)  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
if sys.argv[1] == "reuse":
    reuse_freed_memory()
def step():  # a training step's pattern: fresh tensors of many sizes, a few alive at a time, written, freed
    alive = []
    for mib in (1, 2, 4, 8, 16, 31, 16, 8, 4, 2, 1):
        alive = alive[-2:] + [torch.empty(mib << 18).fill_(1.0)]
for _ in range(6):  # the first steps' memory is new either way (the heap settles)
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(mode: str) -> str:
    return subprocess.run([sys.executable, "-c", _FAULTS_OF_FRESH_BLOCKS, mode], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_freed_memory_is_reused_instead_of_faulted_in_again():
    unmapped = _page_faults("default")
    if unmapped == "unsupported":
        pytest.skip("the C library is not glibc")
    assert int(unmapped) > 100_000  # each freed block unmapped or trimmed, each new one faulted in: ~24,000 a step
    assert int(_page_faults("reuse")) < int(unmapped) / 10  # mostly none; the heap may still grow once or twice
