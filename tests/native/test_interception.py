"""Which function a program really calls, for every way it can reach the driver."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.native.conftest import MIB, Lab, parse

LIMITER = "libgpuops-limiter.so"
DRIVER = "libcuda.so.1"


def symcheck(lab: Lab, *names: str) -> dict[tuple[str, str], list[str]]:
    p = subprocess.run(
        [str(lab.built.fake_dir / "symcheck"), *names],
        env=lab.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return {(how, rest[0]): rest[1:] for how, rows in parse(p.stdout).items() for rest in rows}


@pytest.mark.parametrize(
    ("name", "ptsz_variant"),
    [
        ("cuMemAlloc_v2", False),
        ("cuMemCreate", False),
        ("cuArray3DCreate_v2", False),
        ("cuMemGetInfo_v2", False),
        ("cuLaunchKernel", True),
        ("cuLaunchKernelEx", True),
        ("cuLaunchCooperativeKernel", True),
        ("cuGraphLaunch", True),
        ("cuMemAllocAsync", True),
        ("cuMemAllocFromPoolAsync", True),
        ("cuMemFreeAsync", True),
        ("cuCtxSynchronize", False),
        ("cuStreamSynchronize", True),
    ],
)
def test_intercepted_entry_points_lead_to_the_limiter(lab: Lab, name: str, ptsz_variant: bool) -> None:
    seen = symcheck(lab, name)
    assert seen[("dlsym", "cuGetProcAddress_v2")] == [LIMITER]
    assert seen[("dlsym", name)] == [LIMITER]
    assert seen[("default", name)] == [LIMITER]
    assert seen[("procaddr", name)] == [LIMITER, "0", "0"]
    assert seen[("procaddr_ptsz", name)] == [LIMITER, "0", "0"]


def test_ptsz_lookups_get_the_per_thread_wrappers(lab: Lab) -> None:
    # The limiter maps the driver's answer by identity, so the per-thread variant it returns
    # is replaced by the per-thread wrapper, not by the legacy one.
    p = subprocess.run(
        [
            str(lab.built.fake_dir / "cudaprog"),
            "--via",
            "procaddr_ptsz",
            "init",
            "launch",
            "3",
            "1000",
            "kernel",
        ],
        env=lab.env(GPUOPS_LOG_LEVEL="4"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0 and "launch 0" in p.stdout


@pytest.mark.parametrize(
    "name", ["cuEventSynchronize", "cuEventRecord", "cuModuleGetFunction", "cuStreamCreate"]
)
def test_other_driver_functions_pass_through_untouched(lab: Lab, name: str) -> None:
    seen = symcheck(lab, name)
    assert seen[("dlsym", name)] == [DRIVER]
    assert seen[("procaddr", name)] == [DRIVER, "0", "0"]


def test_unknown_names_stay_unknown(lab: Lab) -> None:
    seen = symcheck(lab, "cuNoSuchFunction")
    assert seen[("dlsym", "cuNoSuchFunction")] == ["NULL"]
    assert seen[("procaddr", "cuNoSuchFunction")] == ["NULL", "500", "1"]  # CUDA_ERROR_NOT_FOUND


def test_rtld_next_is_answered_for_the_caller(lab: Lab) -> None:
    lab.table("tenant a memory=64MiB")
    p = subprocess.run(
        [str(lab.built.fake_dir / "interposer"), str(40 * MIB), str(40 * MIB)],
        env=lab.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    out = parse(p.stdout)
    assert out["alloc"] == [["0"], ["2"]]  # program -> limiter -> driver: capped
    assert out["wrapped"] == [["2"]]


def test_programs_without_cuda_are_left_alone(lab: Lab) -> None:
    # With /etc/ld.so.preload the library is in every process: looking up names that look like
    # driver functions must not load the driver into programs that do not use it.
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None)\n"
        "for name in ('cuInit', 'cuMemAlloc_v2', 'cuserid', 'nvmlInit_v2'):\n"
        "    getattr(libc, name, None)\n"
        "print(any('libcuda' in line or 'nvidia-ml' in line for line in open('/proc/self/maps')))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], env=lab.env(), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"
