"""torch.compile over the distributed attention on 2 gloo ranks: with fullgraph=True (any graph
break raises), inductor's compiled forward and backward of ring, zigzag and stripe calls and of
the packed ring and zigzag rings equal eager's within float32 rounding, sinks and softcap
included."""
from helpers import distributed_cases as dc
import torch

from ipex_flash import distributed as ifd


def _loss(q, k, v, sinks, shards):
    """One call of each layout on its own shards of the same batch."""
    total = 0
    for (ql, kl, vl), fn in zip(shards(q, k, v), (ifd.ring_flash_attn_func,
                                                  ifd.zigzag_ring_flash_attn_func,
                                                  ifd.stripe_flash_attn_func)):
        out = fn(ql, kl, vl, causal=True, window_size=(19, -1), softcap=4.0, sinks=sinks)
        total = total + (out.float() ** 2).sum()
    return total


def _packed_loss(ring_qkv, zigzag_qkv, sinks, cu_local, longest):
    """The packed ring and zigzag ring on their shards (made outside: sharding reads the
    offsets, the attention does not)."""
    total = 0
    for qkv, fn in ((ring_qkv, ifd.ring_flash_attn_varlen_func),
                    (zigzag_qkv, ifd.zigzag_ring_flash_attn_varlen_func)):
        out = fn(*qkv.unbind(1), cu_local, longest, causal=True, softcap=4.0, sinks=sinks)
        total = total + (out.float() ** 2).sum()
    return total


def _compiled_equals_eager(rank, world):
    torch.manual_seed(0)
    whole = [torch.randn(2, 45, 4, 16) for _ in range(3)]
    sinks = torch.randn(4)

    def shards(q, k, v):
        return [tuple(cut(t, rank, world) for t in (q, k, v))
                for cut in (ifd.contiguous_shard, ifd.zigzag_shard, ifd.stripe_shard)]

    compiled = torch.compile(_loss, backend="inductor", fullgraph=True)
    results = []
    for fn in (_loss, compiled):
        leaves = [t.clone().requires_grad_() for t in whole + [sinks]]
        loss = fn(*leaves, shards)
        loss.backward()
        results.append([loss.detach()] + [t.grad for t in leaves])
    cu = torch.tensor([0, 12, 40], dtype=torch.int32)
    packed = torch.randn(40, 3, 4, 16)
    ring_qkv, cu_local, longest = ifd.varlen_shard(packed, cu, rank, world)
    zigzag_qkv = ifd.zigzag_varlen_shard(packed, cu, rank, world)[0]
    compiled = torch.compile(_packed_loss, backend="inductor", fullgraph=True)
    for fn in (_packed_loss, compiled):
        leaves = [t.clone().requires_grad_() for t in (ring_qkv, zigzag_qkv, sinks)]
        loss = fn(*leaves, cu_local, longest)
        loss.backward()
        results.append([loss.detach()] + [t.grad for t in leaves])
    return [(dc.max_error(c, e), e.abs().max().item())
            for eager, compiled_ in (results[:2], results[2:])
            for e, c in zip(eager, compiled_)]


def test_compiled_equals_eager_on_two_ranks():
    world = dc.World(2)
    try:
        per_rank = world.run(_compiled_equals_eager)
    finally:
        world.close()
    for errors in per_rank:
        for error, size in errors:
            assert error <= 1e-5 * max(1.0, size), errors
