"""python -m ipex_flash selftest (ipex_flash/tools/selftest.py): passes on the CPU device, reports
every family and dtype, and fails when a check's answer is wrong or a check raises."""
import json

import pytest
import torch

from ipex_flash.tools import selftest

FAMILIES = {"forward", "features", "varlen", "backward", "dropout", "kvcache"}
DTYPE_NAMES = {"float32", "float16", "bfloat16"}


def test_quick_run_passes_and_covers_every_family_and_dtype(tmp_path, capsys):
    path = tmp_path / "selftest.json"
    assert selftest.run("cpu", quick=True, json_path=str(path)) == 0
    report = json.loads(path.read_text())
    checks = report["checks"]
    assert {(c["family"], c["dtype"]) for c in checks} == {
        (f, d) for f in FAMILIES for d in DTYPE_NAMES}
    assert all(c["passed"] and c["error"] <= c["tolerance"] for c in checks), [
        c for c in checks if not c["passed"]]
    assert {"dq", "dk", "dv"} <= {c["case"].rsplit(": ", 1)[-1] for c in checks
                                  if c["family"] == "backward"}
    assert report["failed"] == 0 and report["passed"] == len(checks)
    assert report["versions"]["torch"] == torch.__version__
    assert set(report["matrix_engine"]) == {"IPEX_FLASH_MATRIX", "device_reports_one"}
    out = capsys.readouterr().out
    assert "max error" in out and "tolerance" in out
    assert out.rstrip().endswith(f"{len(checks)} passed, 0 failed")


def softcap_and_window_checks():
    return [c for c in selftest.CHECKS if c.case in ("softcap 4", "window (16, 5)")]


def test_a_wrong_answer_fails_its_check(monkeypatch, tmp_path, capsys):
    """A reference perturbed for softcap > 0 fails the softcap check only."""
    reference = selftest.flash_attn_reference

    def perturbed(*args, softcap=0.0, **kwargs):
        out, lse = reference(*args, softcap=softcap, **kwargs)
        return (out * 1.05 if softcap > 0 else out), lse

    monkeypatch.setattr(selftest, "flash_attn_reference", perturbed)
    monkeypatch.setattr(selftest, "CHECKS", softcap_and_window_checks())
    path = tmp_path / "selftest.json"
    assert selftest.run("cpu", quick=True, json_path=str(path)) == 1
    checks = json.loads(path.read_text())["checks"]
    assert len(checks) == 6
    for check in checks:
        assert check["passed"] == (check["case"] != "softcap 4"), check
    out = capsys.readouterr().out
    assert out.count("FAIL") == 3 and out.rstrip().endswith("3 passed, 3 failed")


def test_a_check_that_raises_fails_and_the_run_goes_on(monkeypatch, capsys):
    def broken(*, dev, dtype):
        raise RuntimeError("kernel exploded\nsecond line of the log")

    monkeypatch.setattr(selftest, "CHECKS", [selftest.Check("kvcache", "broken", broken),
                                             *softcap_and_window_checks()])
    assert selftest.run("cpu", quick=True) == 1
    out = capsys.readouterr().out
    assert out.count("FAIL RuntimeError: kernel exploded") == 3
    assert "second line" not in out
    assert out.rstrip().endswith("6 passed, 3 failed")


@pytest.mark.skipif(hasattr(torch, "xpu") and torch.xpu.is_available(), reason="this test checks the refusal on a machine without an XPU, and this one has one")
def test_unavailable_device(capsys):
    assert selftest.run("xpu") == 2
    assert "'xpu' is not available" in capsys.readouterr().out


def test_arguments():
    import argparse
    parser = argparse.ArgumentParser()
    selftest.add_arguments(parser)
    args = parser.parse_args(["--device", "xpu:1", "--quick", "--json", "out.json"])
    assert (args.device, args.quick, args.json) == ("xpu:1", True, "out.json")
    assert parser.parse_args([]).device is None  # launch.default_device()


def test_default_device_is_an_xpu_where_torch_has_one(monkeypatch):
    """The demo and the self-test run where a user's model would: on the XPU when torch has
    one, else on the CPU (the SYCL CPU device)."""
    import torch
    from ipex_flash.ops import launch
    has_xpu = hasattr(torch, "xpu") and torch.xpu.is_available()
    assert launch.default_device().type == ("xpu" if has_xpu else "cpu")
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    assert launch.default_device() == torch.device("xpu")
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    assert launch.default_device() == torch.device("cpu")
