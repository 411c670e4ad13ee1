"""Shared by the SGLang call tests: SGLang's token pool and the page table its XPU backend
builds from it, and the float64 reference of one sequence with flash-attn 3's qv."""
import torch

from ipex_flash.reference import flash_visibility


def token_pool(seq_lens, page_size, heads_kv, head_dim, dtype):
    """SGLang's KV pool (tokens, heads_kv, head_dim), its req_to_token rows (each sequence's
    token slots, whole pages taken from a shuffled pool, two pages left unused) and the page
    table its XPU backend passes: req_to_token[:, :max_len] at every page_size-th column,
    divided by page_size."""
    pages_each = [-(-n // page_size) for n in seq_lens]
    num_pages = sum(pages_each) + 2
    order = torch.randperm(num_pages).tolist()
    width = max(pages_each) * page_size
    req_to_token = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    for b, pages in enumerate(pages_each):
        for p in range(pages):
            page = order.pop()
            req_to_token[b, p * page_size:(p + 1) * page_size] = (
                page * page_size + torch.arange(page_size, dtype=torch.int32))
    pool = torch.randn(num_pages * page_size, heads_kv, head_dim).to(dtype)
    max_len = max(seq_lens)
    strided = torch.arange(0, max_len, page_size)
    page_table = (req_to_token[:, :max_len][:, strided] // page_size).to(torch.int32)
    return pool, req_to_token, page_table


def reference(q, k, v, scale, causal=True, window=(-1, -1), softcap=0.0, sinks=None, qv=None):
    """float64 (out (Nq, H, Dv), lse (H, Nq)) of one sequence, q (Nq, H, D), k (Nk, Hkv, D),
    v (Nk, Hkv, Dv): scores scale * (q . k + qv . v) (flash-attn 3's qv, when given), softcap,
    flash-attn's bottom-right masks, a sink per head joining the softmax denominator."""
    q, k, v = (t.double() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k)
    if qv is not None:
        scores = scores + torch.einsum("qhd,khd->hqk", qv.double(), v)
    scores = scores * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    _, visible = flash_visibility(q.shape[0], k.shape[0], causal, window)
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    if sinks is not None:
        lse = torch.logaddexp(lse, sinks.double()[:, None])
    probs = torch.exp(scores - lse[..., None])
    return torch.einsum("hqk,khd->qhd", probs, v), lse
