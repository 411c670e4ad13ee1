"""Loads the host module with the SYCL environment it needs.

Everything here must happen before the first SYCL call of the process: the OpenCL ICD that
exposes the SYCL CPU device, and the persistent kernel cache, are read from the environment
once. Settings the user has made are never overridden.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys
from pathlib import Path

_ICD_LIBRARY = "libintelocl.so"

# CPU targets of the OpenCL CPU runtime whose code may use AMX tiles (joint_matrix).
_AMX_TARGETS = ("sapphirerapids", "emeraldrapids", "graniterapids", "diamondrapids")


@functools.lru_cache(maxsize=None)
def _cpu_has_amx() -> bool:
    """The CPU has AMX bf16 tiles and the kernel lets processes use them."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split()
                    return "amx_bf16" in flags and "amx_tile" in flags
    except OSError:
        pass
    return False


def _library_dirs() -> list[Path]:
    """Directories where pip puts the intel-* wheels' shared libraries."""
    here = Path(__file__).resolve().parent  # <prefix>/lib/python3.X/site-packages/ipex_flash
    candidates = [Path(sys.prefix) / "lib", here.parents[2]]
    return [d for d in dict.fromkeys(candidates) if d.is_dir()]


def default_cache_dir() -> Path:
    """Where compiled kernels are kept across processes: $IPEX_FLASH_CACHE_DIR, else
    $XDG_CACHE_HOME/ipex_flash, else ~/.cache/ipex_flash."""
    if os.environ.get("IPEX_FLASH_CACHE_DIR"):
        return Path(os.environ["IPEX_FLASH_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ipex_flash"


def _configure_environment() -> None:
    if "OCL_ICD_FILENAMES" not in os.environ:
        # The ICD file shipped by intel-opencl-rt points at a path that does not exist, so
        # the loader must be told where the CPU runtime really is.
        for d in _library_dirs():
            if (d / _ICD_LIBRARY).exists():
                os.environ["OCL_ICD_FILENAMES"] = str(d / _ICD_LIBRARY)
                break
    if "CL_CONFIG_CPU_TARGET_ARCH" not in os.environ and _cpu_has_amx():
        # The OpenCL CPU runtime picks its target from the CPU model, and on Xeons that report
        # a generic model (virtual machines) it misses AMX: joint_matrix kernels then abort
        # the process in its backend. Naming the first AMX generation enables them.
        os.environ["CL_CONFIG_CPU_TARGET_ARCH"] = _AMX_TARGETS[0]
    if "SYCL_CACHE_PERSISTENT" not in os.environ:
        os.environ["SYCL_CACHE_PERSISTENT"] = "1"
    if "SYCL_CACHE_DIR" not in os.environ:
        # Binaries for an AMX target must not be found by a CPU without it: one directory per
        # target.
        target = os.environ.get("CL_CONFIG_CPU_TARGET_ARCH", "native")
        cache_dir = default_cache_dir() / f"sycl-{target}"
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            os.environ["SYCL_CACHE_DIR"] = str(cache_dir)
        except OSError:
            pass  # unwritable home: kernels are still built, just not kept across runs


# GNU OpenMP (torch's CPU build) keeps idle workers spinning for GOMP_SPINCOUNT iterations
# after each parallel region (300000 by default: milliseconds). On the SYCL CPU device our
# kernels run on the OpenCL runtime's own (TBB) threads, which then share the cores with
# spinning torch threads: inside a model, attention right after a projection ran 1.5-1.9x
# slower than standalone. libgomp reads the setting once, when torch loads it; a short spin
# (10000) removes the slowdown and keeps torch's back-to-back small ops as fast.
# OMP_WAIT_POLICY=PASSIVE also removes it, but makes small ops slower.
_GOMP_SPINCOUNT = "10000"
_OPENMP_SETTINGS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")


def _shorten_openmp_spin() -> str:
    """Sets GOMP_SPINCOUNT if torch (and so libgomp) is not loaded yet and the user set neither
    variable. Returns what happened: "set", "user" (the user's setting stands) or "late"
    (torch was imported first: its threads keep the default spin)."""
    if any(name in os.environ for name in _OPENMP_SETTINGS):
        return "user"
    if "torch" in sys.modules:
        return "late"
    os.environ["GOMP_SPINCOUNT"] = _GOMP_SPINCOUNT
    return "set"


OPENMP_SPIN = _shorten_openmp_spin()


def _load_host_module():
    _configure_environment()
    try:
        from ipex_flash import _C
    except ImportError:
        # The module's rpath finds libsycl in its own environment's lib directory; an
        # unusual install layout may separate them, so load it from this interpreter's.
        for d in _library_dirs():
            lib = d / "libsycl.so.9"
            if lib.exists():
                ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
                break
        from ipex_flash import _C
    _C.set_cpu_matrix_engine(cpu_matrix_engine_enabled())
    _guard_builds(_C)
    _share_builds(_C)
    return _C


def _cache_subdir(name: str):
    """default_cache_dir()/name, made if missing; None where it cannot be made."""
    path = default_cache_dir() / name
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return path


def _guard_builds(module) -> None:
    """Has each new matrix-engine program built first in a child process (build_guard.hpp):
    a device compiler that crashes on one then costs that program, not this process."""
    verdict_dir = _cache_subdir("build-verdicts")
    if verdict_dir is None:
        return  # nowhere to keep verdicts: programs are built in this process, as without it
    if sys.executable:
        module.set_build_guard(sys.executable, module.__file__, str(verdict_dir))


def _share_builds(module) -> None:
    """Has processes on this machine that need the same kernel build it once (build_lock.hpp):
    the first builds, the others wait and load it from the persistent cache. Without that
    cache there is nothing to load, so each process builds its own."""
    if os.environ.get("SYCL_CACHE_PERSISTENT") != "1":
        return
    lock_dir = _cache_subdir("build-locks")
    if lock_dir is not None:
        module.set_build_lock_dir(str(lock_dir))


def cpu_matrix_engine_enabled() -> bool:
    """True when the SYCL CPU device compiles for an AMX target on a CPU that has AMX."""
    return os.environ.get("CL_CONFIG_CPU_TARGET_ARCH") in _AMX_TARGETS and _cpu_has_amx()


C = _load_host_module()
