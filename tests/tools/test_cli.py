"""python -m ipex_flash demo (ipex_flash/tools/cli.py): runs on launch.default_device() (the
XPU where torch has one, else the CPU: tests/tools/test_selftest.py checks that choice) and says
which device ran. Here it runs on the CPU; the XPU path has not run (no Intel GPU)."""
import argparse

from ipex_flash.ops import launch
from ipex_flash.tools import cli


def test_demo_runs_on_the_default_device_and_says_which(capsys):
    args = argparse.Namespace(batch=1, heads=2, seq_len=64, head_dim=32, dtype="float32",
                              causal=True, repeats=1, device=None)
    cli.demo(args)
    out = capsys.readouterr().out
    assert out.startswith(f"device: torch {launch.default_device()} -> "), out
    error = float(out.split("max |ipex_flash - SDPA| = ")[1].split()[0])
    assert error < 1e-4, out
