"""Loads the host module with the SYCL environment it needs.

Everything here must happen before the first SYCL call of the process: the OpenCL ICD that
exposes the SYCL CPU device, and the persistent kernel cache, are read from the environment
once. Settings the user has made are never overridden.
"""
from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

_ICD_LIBRARY = "libintelocl.so"


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
    if "SYCL_CACHE_PERSISTENT" not in os.environ:
        os.environ["SYCL_CACHE_PERSISTENT"] = "1"
    if "SYCL_CACHE_DIR" not in os.environ:
        cache_dir = default_cache_dir() / "sycl"
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            os.environ["SYCL_CACHE_DIR"] = str(cache_dir)
        except OSError:
            pass  # unwritable home: kernels are still built, just not kept across runs


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
    return _C


C = _load_host_module()
