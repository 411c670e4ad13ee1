"""gpu-check's SPIR-V: each module (a program's header, kernels and build options) compiled by
our own kernel-compiler path, in child processes working side by side, and kept between runs.

A module's SPIR-V is a function of its id (gpu_check._module_id hashes header, kernels and
options), the device sources and the kernel compiler, so it is kept in a store named by the last
two (store_dir): a second run, or a run for more targets, compiles only modules it has not seen
(PVC, BMG and Lunar Lake plan the same programs; DG2 and Arrow Lake-H share theirs).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ipex_flash._runtime import C, default_cache_dir


def store_dir() -> Path:
    """default_cache_dir()/spirv/<hash of the device sources and of the versions of the SYCL
    runtime's packages, which hold the kernel compiler>."""
    runtime = sorted(f"{d.metadata['Name'].lower()}=={d.version}"
                     for d in importlib.metadata.distributions()
                     if (d.metadata["Name"] or "").lower().startswith("intel-"))
    text = "\n".join([f"{C.device_sources_hash():016x}", *runtime])
    return default_cache_dir() / "spirv" / hashlib.sha1(text.encode()).hexdigest()[:16]


# Stores kept beside the one in use: each edit of the device sources starts a new one (about
# 11 MB for one GPU's quick grid), so the oldest are removed.
KEPT_STORES = 4


def kept_store() -> Path:
    """store_dir(), made and marked as used; all but the KEPT_STORES last used stores beside
    it are removed."""
    store = store_dir()
    store.mkdir(parents=True, exist_ok=True)
    os.utime(store)
    stores = sorted((d for d in store.parent.iterdir() if d.is_dir()),
                    key=lambda d: d.stat().st_mtime, reverse=True)
    for old in stores[KEPT_STORES:]:
        shutil.rmtree(old, ignore_errors=True)
    return store


def _worker(job_dir: str) -> None:
    """Child process: compiles the modules listed in job_dir/modules.json to SPIR-V. The
    runtime dumps every device image of a program it compiles into the working directory, one
    file per image (a program's kernels are split into images by the device features they use,
    e.g. fp16), as sycl_spir64.spv, sycl_spir64_1.spv, ..., renamed here <module>.part<i>.spv;
    a module the kernel compiler refuses gets <module>.error instead."""
    os.chdir(job_dir)
    modules = json.loads(Path("modules.json").read_text())
    for module_id, (header, kernels, options) in modules.items():
        for stale in Path(".").glob("sycl_spir64*.spv"):
            stale.unlink()
        try:
            C.compile_to_spirv(header, kernels, options)
        except Exception as e:
            # A GPU's large register file is a kernel property the runtime turns into
            # -ze-opt-large-register-file, which the CPU device refuses after the SPIR-V was
            # written: for gpu-check that SPIR-V is the result. Other errors are recorded per
            # module; the others still build.
            if not ("-ze-opt-large-register-file" in str(e) and any(Path(".").glob("sycl_spir64*.spv"))):
                Path(f"{module_id}.error").write_text(str(e))
                continue
        for i, image in enumerate(sorted(Path(".").glob("sycl_spir64*.spv"))):
            image.rename(f"{module_id}.part{i}.spv")


def built(store: Path, module_id: str) -> bool:
    """Whether `store` holds the module's result: its SPIR-V (whose last file to arrive is the
    .done mark) or the kernel compiler's error."""
    return (store / f"{module_id}.done").exists() or (store / f"{module_id}.error").exists()


def build(modules: dict, store: Path, jobs: int) -> None:
    """SPIR-V of every module not yet in `store`, through the kernel compiler in up to `jobs`
    child processes (the dump is switched on by the environment before the SYCL runtime
    starts), each in a directory of its own; results are moved into `store` when done, so
    runs that share it never see half a module."""
    store.mkdir(parents=True, exist_ok=True)
    todo = sorted(m for m in modules if not built(store, m))
    if not todo:
        return
    env = dict(os.environ, SYCL_DUMP_IMAGES="1", SYCL_CACHE_PERSISTENT="0",
               IPEX_FLASH_QUIET="1")
    with tempfile.TemporaryDirectory(dir=store, prefix="building-") as scratch:
        children, workers = [], max(1, min(jobs, len(todo)))
        for i in range(workers):
            job_dir = Path(scratch) / str(i)
            job_dir.mkdir()
            (job_dir / "modules.json").write_text(
                json.dumps({m: modules[m] for m in todo[i::workers]}))
            children.append((job_dir, subprocess.Popen(
                [sys.executable, "-c", "import sys; from ipex_flash.tools.gpu_spirv import "
                 "_worker; _worker(sys.argv[1])", str(job_dir)], env=env)))
        failed = [child.args for _, child in children if child.wait() != 0]
        if failed:
            raise subprocess.CalledProcessError(1, failed[0])
        for job_dir, _ in children:
            for result in sorted(job_dir.glob("*.spv")) + sorted(job_dir.glob("*.error")):
                os.replace(result, store / result.name)
            for module_id in json.loads((job_dir / "modules.json").read_text()):
                if not (store / f"{module_id}.error").exists():
                    (store / f"{module_id}.done").touch()
