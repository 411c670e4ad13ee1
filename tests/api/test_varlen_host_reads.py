"""flash_attn_varlen_func reads cu_seqlens back from the device once per offsets tensor (and
in-place edit), not per call: a model's layers, and a ring's blocks, pass the same tensor many
times in a step, and each read is a host sync on a GPU. An edited tensor is read and checked
again."""
import os
import sys
from collections import Counter

import pytest
import torch

import ipex_flash
from ipex_flash.ops import validation

HOST_READS = ("tolist", "item", "cpu", "__int__", "__float__", "__bool__", "numpy")
PACKAGE = os.path.dirname(ipex_flash.__file__)


@pytest.fixture
def host_reads(monkeypatch):
    """Counts host reads of tensors made from ipex_flash's own code."""
    counts = Counter()
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            if sys._getframe(1).f_code.co_filename.startswith(PACKAGE):
                counts[_name] += 1
            return _original(*args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts


def _packed(lengths):
    torch.manual_seed(0)
    total = sum(lengths)
    q, k, v = (torch.randn(total, 4, 32) for _ in range(3))
    cu = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return q, k, v, cu, max(lengths)


def test_a_warm_call_reads_nothing_back(host_reads):
    q, k, v, cu, longest = _packed([7, 20, 13])
    first = ipex_flash.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True)
    assert sum(host_reads.values()) > 0  # the first call reads and checks the offsets
    host_reads.clear()
    again = ipex_flash.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True)
    assert not host_reads, dict(host_reads)
    torch.testing.assert_close(again, first, rtol=0, atol=0)


def test_an_edited_tensor_is_checked_again(host_reads):
    q, k, v, cu, longest = _packed([7, 20, 13])
    ipex_flash.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest)
    cu[1] = 21  # a sequence of 21 tokens now, past max_seqlen=20
    host_reads.clear()
    with pytest.raises(ValueError, match=r"a sequence of q has 21 tokens, more than max_seqlen_q=20"):
        ipex_flash.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest)
    assert host_reads
    cu[1] = 50  # decreasing now
    with pytest.raises(ValueError, match=r"cu_seqlens_q must start at 0, never decrease"):
        ipex_flash.flash_attn_varlen_func(q, k, v, cu, cu, 50, 50)


def test_a_refused_tensor_is_not_kept():
    q, k, v, cu, longest = _packed([7, 20, 13])
    bad = torch.tensor([0, 9, 8, 40], dtype=torch.int32)
    for _ in range(2):
        with pytest.raises(ValueError, match=r"never decrease"):
            ipex_flash.flash_attn_varlen_func(q, k, v, bad, cu, longest, longest)
    assert validation._checked_offsets.get(bad) is None
