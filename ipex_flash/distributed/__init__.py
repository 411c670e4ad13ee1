"""Attention over a sequence sharded across the ranks of a torch.distributed process group
(context parallelism), on the ipex_flash kernels. Layout (batch, seqlen_local, nheads,
headdim); names and arguments of ring-flash-attention 0.1.8 (its transformers adapter
included), plus Ulysses and yunchang's hybrid of the two (USP):

    from ipex_flash.distributed import zigzag_ring_flash_attn_func, zigzag_shard
    out = zigzag_ring_flash_attn_func(zigzag_shard(q, rank, world), ..., causal=True, group=g)

ring.py, stripe.py, varlen.py and zigzag_varlen.py (the ring, over _ring_engine.py and the
plan of kernel calls in _blocks.py, which also says which ranks a window lets exchange;
what the ranks agreed on is learned once, _agreement.py), llama3.py (K/V all-gathered over
equal slices of a packed stream; llama3_layout.py its offsets), hf_adapter.py (transformers
models on llama3; transformers itself is imported only when substitute_hf_flash_attn runs,
so importing this package does not need it), ulysses.py (all-to-all over heads), usp.py
(Ulysses inside, ring across), packed.py (qkv/kv-packed forms), sharding.py (shard and
unshard helpers), ring_flash_attn.py (ring-flash-attention's names, for `import *`).
docs/distributed.md says which to use when.
"""
from ipex_flash.distributed.hf_adapter import (
    substitute_hf_flash_attn, update_ring_flash_attn_params, use_ring_attn)
from ipex_flash.distributed.llama3 import (
    llama3_flash_attn_prepare_cu_seqlens, llama3_flash_attn_varlen_func,
    llama3_flash_attn_varlen_kvpacked_func, llama3_flash_attn_varlen_qkvpacked_func)
from ipex_flash.distributed.packed import (
    ring_flash_attn_kvpacked_func, ring_flash_attn_qkvpacked_func,
    ring_flash_attn_varlen_kvpacked_func, ring_flash_attn_varlen_qkvpacked_func,
    stripe_flash_attn_kvpacked_func, stripe_flash_attn_qkvpacked_func,
    zigzag_ring_flash_attn_kvpacked_func, zigzag_ring_flash_attn_qkvpacked_func,
    zigzag_ring_flash_attn_varlen_kvpacked_func, zigzag_ring_flash_attn_varlen_qkvpacked_func)
from ipex_flash.distributed.ring import ring_flash_attn_func, zigzag_ring_flash_attn_func
from ipex_flash.distributed.sharding import (
    contiguous_shard, contiguous_unshard, stripe_shard, stripe_unshard, varlen_shard,
    varlen_unshard, zigzag_shard, zigzag_unshard, zigzag_varlen_shard, zigzag_varlen_unshard)
from ipex_flash.distributed.stripe import stripe_flash_attn_func
from ipex_flash.distributed.ulysses import ulysses_flash_attn_func
from ipex_flash.distributed.usp import (
    LongContextAttention, set_seq_parallel_pg, usp_flash_attn_func, usp_groups_from_mesh,
    usp_shard)
from ipex_flash.distributed.varlen import ring_flash_attn_varlen_func
from ipex_flash.distributed.zigzag_varlen import zigzag_ring_flash_attn_varlen_func

__all__ = [
    "LongContextAttention", "contiguous_shard", "contiguous_unshard",
    "llama3_flash_attn_prepare_cu_seqlens", "llama3_flash_attn_varlen_func",
    "llama3_flash_attn_varlen_kvpacked_func", "llama3_flash_attn_varlen_qkvpacked_func",
    "ring_flash_attn_func",
    "ring_flash_attn_kvpacked_func", "ring_flash_attn_qkvpacked_func",
    "ring_flash_attn_varlen_func", "ring_flash_attn_varlen_kvpacked_func",
    "ring_flash_attn_varlen_qkvpacked_func", "set_seq_parallel_pg", "stripe_flash_attn_func",
    "stripe_flash_attn_kvpacked_func", "stripe_flash_attn_qkvpacked_func", "stripe_shard",
    "stripe_unshard", "substitute_hf_flash_attn", "ulysses_flash_attn_func",
    "update_ring_flash_attn_params", "use_ring_attn", "usp_flash_attn_func",
    "usp_groups_from_mesh", "usp_shard", "varlen_shard", "varlen_unshard",
    "zigzag_ring_flash_attn_func", "zigzag_ring_flash_attn_kvpacked_func",
    "zigzag_ring_flash_attn_qkvpacked_func", "zigzag_ring_flash_attn_varlen_func",
    "zigzag_ring_flash_attn_varlen_kvpacked_func",
    "zigzag_ring_flash_attn_varlen_qkvpacked_func", "zigzag_shard", "zigzag_unshard",
    "zigzag_varlen_shard", "zigzag_varlen_unshard",
]
