"""Shared by the engine-call tests: the float64 reference of one sequence (with attention
sinks) and the keys a block table gives a sequence."""
import torch

from ipex_flash.reference import flash_attn_reference

SENTINEL = 7.0


def reference(q, k, v, causal=True, window=(-1, -1), softcap=0.0, sinks=None):
    """float64 (out, lse) of one sequence, q (Nq, H, D), k, v (Nk, Hkv, D); a sink joins each
    head's softmax denominator: out * e^lse / (e^lse + e^sink)."""
    out, lse = flash_attn_reference(q[None], k[None], v[None], causal, window, softcap)
    out, lse = out[0], lse[0]  # (Nq, H, Dv), (H, Nq)
    if sinks is not None:
        sink = sinks.double()[:, None]
        out = out * torch.sigmoid(lse - sink).transpose(0, 1)[..., None]
        lse = torch.logaddexp(lse, sink)
    return out, lse


def sequence_keys(cache, table_row, n_k):
    """The first n_k keys of a sequence whose pages table_row lists (only those it reads)."""
    pages = -(-n_k // cache.shape[1])
    return cache[table_row[:pages].long()].flatten(0, 1)[:n_k]
