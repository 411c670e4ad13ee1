"""ipex_flash.distributed.ring_flash_attn against ring-flash-attention 0.1.8's package, read
from its source: `import *` gives the same 21 names, and each function takes upstream's
parameters in upstream's order with upstream's defaults (ours add keyword-only softcap= and
sinks= after them). The package itself exports those names, Ulysses' and USP's, and the
adapter's without importing transformers."""
import inspect
import subprocess
import sys

import pytest

_ATTN = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
         ("window_size", (-1, -1)), ("alibi_slopes", None), ("deterministic", False),
         ("return_attn_probs", False), ("group", None)]
_REQ = inspect.Parameter.empty
_LLAMA3 = [("cu_seqlens_q", _REQ), ("cu_seqlens_k", _REQ), ("max_seqlen_q", _REQ),
           ("max_seqlen_k", _REQ), ("heads_k_stride", _REQ), ("local_k_slice", _REQ)]
_VARLEN = [("cu_seqlens", _REQ), ("max_seqlen", _REQ)]


def _fixed(*names):
    return [(n, _REQ) for n in names]


UPSTREAM = {}
for layout in ("ring_flash_attn", "zigzag_ring_flash_attn", "stripe_flash_attn"):
    UPSTREAM[f"{layout}_func"] = _fixed("q", "k", "v") + _ATTN
    UPSTREAM[f"{layout}_kvpacked_func"] = _fixed("q", "kv") + _ATTN
    UPSTREAM[f"{layout}_qkvpacked_func"] = _fixed("qkv") + _ATTN
for layout in ("ring_flash_attn", "zigzag_ring_flash_attn"):
    UPSTREAM[f"{layout}_varlen_func"] = _fixed("q", "k", "v") + _VARLEN + _ATTN
    UPSTREAM[f"{layout}_varlen_kvpacked_func"] = _fixed("q", "kv") + _VARLEN + _ATTN
    UPSTREAM[f"{layout}_varlen_qkvpacked_func"] = _fixed("qkv") + _VARLEN + _ATTN
UPSTREAM["llama3_flash_attn_varlen_func"] = _fixed("q", "k", "v") + _LLAMA3 + _ATTN
UPSTREAM["llama3_flash_attn_varlen_kvpacked_func"] = _fixed("q", "kv") + _LLAMA3 + _ATTN
UPSTREAM["llama3_flash_attn_varlen_qkvpacked_func"] = _fixed("qkv") + _LLAMA3 + _ATTN
UPSTREAM["llama3_flash_attn_prepare_cu_seqlens"] = _fixed("cu_seqlens", "causal", "rank",
                                                          "world_size")
UPSTREAM["substitute_hf_flash_attn"] = _fixed("process_group", "heads_k_stride")
UPSTREAM["update_ring_flash_attn_params"] = _fixed("cu_seqlens", "process_group")


def test_import_star_gives_upstream_names():
    names = {}
    exec("from ipex_flash.distributed.ring_flash_attn import *", names)
    assert sorted(n for n in names if not n.startswith("__")) == sorted(UPSTREAM)


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_signature_is_upstreams(name):
    from ipex_flash.distributed import ring_flash_attn
    params = inspect.signature(getattr(ring_flash_attn, name)).parameters.values()
    positional = [(p.name, p.default) for p in params
                  if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == UPSTREAM[name]
    extra = [p.name for p in params if p.kind is not p.POSITIONAL_OR_KEYWORD]
    assert set(extra) <= {"softcap", "sinks"}, extra


PACKAGE_EXTRAS = {"use_ring_attn", "ulysses_flash_attn_func", "usp_flash_attn_func",
                  "LongContextAttention", "set_seq_parallel_pg", "usp_groups_from_mesh",
                  "usp_shard"}


def test_package_exports_every_function_without_transformers():
    """In a fresh interpreter: `from ipex_flash.distributed import *` gives every upstream
    name and ours, each __all__ name exists, and transformers stays unimported (the adapter
    imports it only when substitute_hf_flash_attn runs)."""
    script = (
        "import sys\n"
        "import ipex_flash.distributed as d\n"
        "names = {}\n"
        "exec('from ipex_flash.distributed import *', names)\n"
        "print(sorted(n for n in names if not n.startswith('__')))\n"
        "print(all(hasattr(d, n) for n in d.__all__), 'transformers' in sys.modules)\n")
    lines = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True, timeout=300).stdout.splitlines()
    exported = set(eval(lines[-2]))  # noqa: S307  (our own printed list)
    wanted = set(UPSTREAM) | PACKAGE_EXTRAS
    assert wanted <= exported, sorted(wanted - exported)
    assert lines[-1] == "True False", lines[-1]
