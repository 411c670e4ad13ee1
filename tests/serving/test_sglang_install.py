"""ipex_flash.integrations.sglang's switch (install() and IPEX_FLASH_SGLANG) in child
processes, where sgl_kernel is not installed, and its refusals: a switch set too late, a broken
sgl_kernel, bad values; and bad input to the calls, with errors naming the argument."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ipex_flash
from ipex_flash.integrations import sglang

IMPORT_CHECK = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
import ipex_flash{install}
from sgl_kernel.flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
from sgl_kernel import merge_state_v2
from ipex_flash.integrations import sglang
assert flash_attn_with_kvcache is sglang.flash_attn_with_kvcache
assert flash_attn_varlen_func is sglang.flash_attn_varlen_func
assert merge_state_v2 is sglang.merge_state_v2
print("installed", sglang.model_dtype)
"""


def _child(code, switch=None, path=()):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, *sys.path]))
    env.pop("IPEX_FLASH_SGLANG", None)
    if switch is not None:
        env["IPEX_FLASH_SGLANG"] = switch
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.parametrize("switch,dtype", [
    (None, "torch.bfloat16"), ("1", "torch.bfloat16"), ("float16", "torch.float16")])
def test_switch_makes_sgl_kernel_flash_attn_ipex_flash_and_logs_it(switch, dtype):
    """install(), or IPEX_FLASH_SGLANG in a process that imports ipex_flash."""
    call = "\nfrom ipex_flash.integrations import sglang as _s\n_s.install()" if switch is None \
        else ""
    run = _child(IMPORT_CHECK.format(install=call), switch)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["installed", dtype]
    assert "INFO:ipex_flash:sgl_kernel.flash_attn is ipex_flash.integrations" \
        ".sglang" in run.stderr and "stand-in package" in run.stderr


def test_without_the_switch_nothing_is_installed():
    run = _child("import ipex_flash, sys; print('sgl_kernel' in sys.modules)", "0")
    assert run.returncode == 0 and run.stdout.strip() == "False", run.stderr[-3000:]


def test_bad_switch_value_raises():
    run = _child("import ipex_flash", "yes")
    assert run.returncode != 0 and "IPEX_FLASH_SGLANG='yes': expected 1, bfloat16 or float16" \
        in run.stderr


def test_installed_sgl_kernel_keeps_its_ops(tmp_path):
    """An installed sgl_kernel is imported and keeps its own merge_state_v2; only flash_attn
    is replaced."""
    package = tmp_path / "sgl_kernel"
    package.mkdir()
    (package / "__init__.py").write_text("def merge_state_v2(*a):\n    return 'theirs'\n")
    (package / "flash_attn.py").write_text(
        "def flash_attn_with_kvcache(*a):\n    return 'theirs'\n")
    code = textwrap.dedent("""
        from ipex_flash.integrations import sglang
        sglang.install()
        import sgl_kernel
        from sgl_kernel.flash_attn import flash_attn_with_kvcache
        assert flash_attn_with_kvcache is sglang.flash_attn_with_kvcache
        assert sgl_kernel.merge_state_v2() == 'theirs'
        print('kept')
    """)
    run = _child(code, path=[str(tmp_path)])
    assert run.returncode == 0 and run.stdout.strip() == "kept", run.stderr[-3000:]


def test_broken_sgl_kernel_raises(tmp_path):
    (tmp_path / "sgl_kernel").mkdir()
    (tmp_path / "sgl_kernel" / "__init__.py").write_text("raise ImportError('no libsycl')\n")
    run = _child("from ipex_flash.integrations import sglang\nsglang.install()",
                 path=[str(tmp_path)])
    assert run.returncode != 0 and "RuntimeError" in run.stderr
    assert "the installed sgl_kernel failed to import" in run.stderr and "no libsycl" in run.stderr


def test_install_after_sglang_bound_another_function_raises(monkeypatch):
    """Aliasing the module then would change nothing SGLang calls: refused, nothing
    changed."""
    backend = type(sys)("sglang.srt.layers.attention.xpu_backend")
    backend.flash_attn_with_kvcache = lambda *a, **kw: None
    monkeypatch.setitem(sys.modules, backend.__name__, backend)
    before = sys.modules.get("sgl_kernel.flash_attn")
    with pytest.raises(RuntimeError, match="xpu_backend was imported before install"):
        sglang.install()
    assert sys.modules.get("sgl_kernel.flash_attn") is before
    with pytest.raises(ValueError, match="model_dtype must be torch.float16 or torch.bfloat16"):
        sglang.install(model_dtype=torch.float32)


def _mla_args(**change):
    buffer = torch.randn(64, 1, 576)
    q = torch.randn(3, 16, 576)
    args = dict(q=q[..., 512:], k_cache=buffer[:, :, 512:].view(-1, 32, 1, 64),
                v_cache=buffer[:, :, :512].view(-1, 32, 1, 512), qv=q[..., :512],
                page_table=torch.tensor([[0], [1]], dtype=torch.int32),
                cache_seqlens=torch.tensor([20, 9], dtype=torch.int32),
                cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32), max_seqlen_q=2,
                causal=True)
    args.update(change)
    return args


@pytest.mark.parametrize("change,error,match", [
    (dict(qv=torch.zeros(3, 16, 256)), ValueError,
     r"qv must have q's shape with v_cache's head dim, \(3, 16, 512\)"),
    (dict(qv=torch.zeros(3, 16, 512, dtype=torch.bfloat16)), TypeError, "qv must have q's dtype"),
    (dict(qv=[0.0]), TypeError, "qv must be a torch.Tensor"),
    (dict(k=torch.zeros(3, 1, 64), v=torch.zeros(3, 1, 512),
          cu_seqlens_k_new=torch.tensor([0, 1, 3], dtype=torch.int32)), ValueError,
     "qv is not taken with an append"),
    (dict(q=torch.zeros(3, 16, 128), k_cache=torch.zeros(2, 32, 1, 128)), ValueError,
     r"q's and qv's head dims together \(128 \+ 512\) must be <= 576"),
    (dict(k_descale=torch.tensor([0.5]), v_descale=torch.tensor([0.25])), ValueError,
     "k_descale and v_descale must be equal"),
    (dict(k_cache=torch.zeros(2, 16, 1, 64)), ValueError,
     "k_cache and v_cache must have the same shape but the head dim"),
])
def test_bad_qv_input(change, error, match):
    args = _mla_args(**change)
    with pytest.raises(error, match=match):
        sglang.flash_attn_with_kvcache(**args)
    with pytest.raises(error, match=match):
        ipex_flash.flash_attn_with_kvcache(**args)


@pytest.mark.parametrize("change,error,match", [
    (dict(seqused_q=torch.ones(2, dtype=torch.int32)), ValueError, "seqused_q must be None"),
    (dict(seqused_k=torch.ones(2, dtype=torch.int32)), ValueError, "seqused_k must be None"),
    (dict(sm_margin=-1), ValueError, "sm_margin must be an int >= 0"),
    (dict(pack_gqa="yes"), TypeError, "pack_gqa must be None or a bool"),
    (dict(qv=torch.zeros(5, 2, 16)), ValueError, r"qv must have q's shape .*\(5, 2, 32\)"),
])
def test_bad_varlen_input(change, error, match):
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    args = dict(q=torch.randn(5, 2, 16), k=torch.randn(5, 2, 16), v=torch.randn(5, 2, 32),
                cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=3, max_seqlen_k=3)
    args.update(change)
    with pytest.raises(error, match=match):
        sglang.flash_attn_varlen_func(**args)


@pytest.mark.parametrize("change,error,match", [
    (dict(v_b=torch.zeros(3, 2, 4)), ValueError, "v_a and v_b must have one shape"),
    (dict(s_b=torch.zeros(2, 3)), ValueError, r"s_b must be \(tokens, heads\) = \(3, 2\)"),
    (dict(v_merged=torch.zeros(3, 2, 8, dtype=torch.float16)), ValueError,
     "v_merged must be a torch.float32 tensor of shape"),
    (dict(v_a=torch.zeros(3, 2, 8, dtype=torch.int32)), TypeError, "v_a and v_b must have one"),
])
def test_bad_merge_input(change, error, match):
    args = dict(v_a=torch.zeros(3, 2, 8), s_a=torch.zeros(3, 2), v_b=torch.zeros(3, 2, 8),
                s_b=torch.zeros(3, 2))
    args.update(change)
    with pytest.raises(error, match=match):
        sglang.merge_state_v2(**args)
