"""Processes that need the same kernel build it once: a file lock per program beside the
persistent kernel cache (host/runtime/build_lock.hpp). The cases run fresh processes on a
cache directory of their own, where the lock and the cache start empty."""
import fcntl
import os
import subprocess
import sys
import time

import pytest

# A vector forward the suite builds anyway; in an empty cache it compiles in seconds.
BUILD = r"""
import sys
from ipex_flash._runtime import C
print("building", flush=True)
C.build_kernel("programs/flash_fwd.hpp", "ipex_flash::flash_fwd_kernel<float, 64, 64, 64, 0, 64>")
print("built", flush=True)
"""

# Long enough for a process that is not held back to load the kernel from the cache (~0.3 s
# idle), with room for a loaded machine.
HELD_SECONDS = 8.0


def start_build(cache_dir, **env):
    environ = dict(os.environ, IPEX_FLASH_CACHE_DIR=str(cache_dir), IPEX_FLASH_QUIET="1", **env)
    for name in ("SYCL_CACHE_DIR", "SYCL_CACHE_PERSISTENT"):
        if name not in env:
            environ.pop(name, None)  # the package derives them from IPEX_FLASH_CACHE_DIR
    return subprocess.Popen([sys.executable, "-c", BUILD], env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(process):
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err
    assert out.split()[-1:] == ["built"], (out, err)


def lock_files(cache_dir):
    locks = cache_dir / "build-locks"
    return sorted(locks.glob("*.lock")) if locks.is_dir() else []


def wait_until_building(process):
    assert process.stdout.readline().strip() == "building", process.stderr.read()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A cache directory in which one process built the program: its lock file is there."""
    cache_dir = tmp_path_factory.mktemp("kernel_cache")
    finish(start_build(cache_dir))
    locks = lock_files(cache_dir)
    assert len(locks) == 1, locks  # one program, one lock
    return cache_dir, locks[0]


def test_a_build_waits_for_the_same_program_built_elsewhere(built):
    cache_dir, lock = built
    with open(lock, "a+") as held:
        # Another process building that program now holds it.
        fcntl.flock(held, fcntl.LOCK_EX)
        process = start_build(cache_dir)
        wait_until_building(process)
        time.sleep(HELD_SECONDS)
        still_waiting = process.poll() is None
        fcntl.flock(held, fcntl.LOCK_UN)
    finish(process)
    assert still_waiting, "the build did not wait for the lock its program's builder held"


def test_without_the_persistent_cache_there_is_no_lock(built):
    """Nothing a waiting process could load: each builds its own, and none waits."""
    cache_dir, lock = built
    with open(lock, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        process = start_build(cache_dir, SYCL_CACHE_PERSISTENT="0")
        try:
            finish(process)
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
    assert lock_files(cache_dir) == [lock]


def test_a_lock_is_released_when_its_holder_dies(built):
    """flock's lock goes with its process, so a builder killed mid-build blocks no one."""
    cache_dir, lock = built
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys, time\n"
         f"f = open({str(lock)!r}, 'a+')\n"
         "fcntl.flock(f, fcntl.LOCK_EX)\n"
         "print('held', flush=True)\n"
         "time.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        process = start_build(cache_dir)
        wait_until_building(process)
        time.sleep(HELD_SECONDS)
        assert process.poll() is None, "the build did not wait for the holder"
    finally:
        holder.kill()
        holder.wait()
    finish(process)
