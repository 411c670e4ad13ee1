"""gpu-check's SPIR-V store (ipex_flash/tools/gpu_spirv.py): each module is compiled once per
device source and kernel compiler, in child processes side by side, and a run that finds it
compiles nothing."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ipex_flash.tools import gpu_check, gpu_grid, gpu_spirv

SPIRV_MAGIC = bytes.fromhex("03022307")  # 0x07230203, little-endian
DEVICE_SOURCES = Path(__file__).resolve().parents[2] / "sycl_src" / "device"


def small_modules():
    """The dropout-mask program BMG builds (a small kernel: seconds to compile), and one
    whose header does not exist."""
    programs = [p for p in gpu_grid.plan_target("bmg", False) if p.family == "dropout_mask"]
    modules = gpu_check.group_modules(programs[:1])
    modules["missing-0"] = ("no_such_header.hpp", ["ipex_flash::nothing"], [])
    return modules


def test_each_module_is_built_once(tmp_path, monkeypatch):
    modules = small_modules()
    good = next(m for m in modules if m != "missing-0")
    gpu_spirv.build(modules, tmp_path, jobs=2)  # one child per module
    parts = sorted(tmp_path.glob(f"{good}.part*.spv"))
    assert parts and all(p.read_bytes()[:4] == SPIRV_MAGIC for p in parts)
    assert gpu_spirv.built(tmp_path, good) and (tmp_path / f"{good}.done").exists()
    assert "no_such_header.hpp" in (tmp_path / "missing-0.error").read_text()
    assert not list(tmp_path.glob("building-*")), "the children's directories are removed"

    def no_child(*args, **kwargs):
        raise AssertionError("a module in the store was compiled again")

    monkeypatch.setattr(gpu_spirv.subprocess, "Popen", no_child)
    gpu_spirv.build(modules, tmp_path, jobs=2)
    assert sorted(tmp_path.glob(f"{good}.part*.spv")) == parts


def store_of(cache_dir, device_sources=None):
    env = dict(os.environ, IPEX_FLASH_CACHE_DIR=str(cache_dir))
    env.pop("IPEX_FLASH_DEVICE_SOURCES", None)
    if device_sources:
        env["IPEX_FLASH_DEVICE_SOURCES"] = str(device_sources)
    return subprocess.run(
        [sys.executable, "-c", "from ipex_flash.tools import gpu_spirv; print(gpu_spirv.store_dir())"],
        env=env, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(not DEVICE_SOURCES.is_dir(), reason="needs the checkout's sycl_src/device")
def test_store_is_named_by_the_device_sources(tmp_path):
    """Another text of any device header is another store; the same text, the same store."""
    same, edited = tmp_path / "same", tmp_path / "edited"
    same.mkdir()
    edited.mkdir()
    # A header of a subfolder, named by its path from sycl_src/device as the headers include it.
    params = (DEVICE_SOURCES / "common" / "params.hpp").read_text()
    for root, text in ((same, params), (edited, params + "// edited\n")):
        (root / "common").mkdir()
        (root / "common" / "params.hpp").write_text(text)
    cache = tmp_path / "cache"
    plain = store_of(cache)
    assert Path(plain).parent == cache / "spirv"
    assert store_of(cache, same) == plain
    assert store_of(cache, edited) not in (plain, "")


def test_only_the_last_used_stores_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("IPEX_FLASH_CACHE_DIR", str(tmp_path))
    old = []
    for i in range(gpu_spirv.KEPT_STORES + 1):
        store = tmp_path / "spirv" / f"old{i}"
        store.mkdir(parents=True)
        os.utime(store, (1000 + i, 1000 + i))  # old0 is the least recently used
        old.append(store)
    store = gpu_spirv.kept_store()
    assert store.is_dir() and store.parent == tmp_path / "spirv"
    left = sorted(d.name for d in store.parent.iterdir())
    newest = [d.name for d in old[-(gpu_spirv.KEPT_STORES - 1):]]
    assert left == sorted([store.name, *newest])
