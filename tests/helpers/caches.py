"""KV caches for flash_attn_with_kvcache and the serving call: contiguous, paged (a shuffled
page pool and its block table), in other memory layouts, and a paged batch of mixed
sequences."""
import ipex_flash  # noqa: F401  (imported before torch, see _runtime.py)
import torch


def make_cache(batch, capacity, heads_kv, head_dim, dtype):
    return (torch.randn(batch, capacity, heads_kv, head_dim, dtype=dtype),
            torch.randn(batch, capacity, heads_kv, head_dim, dtype=dtype))


def to_paged(k_cache, v_cache, page_size):
    """The same cache as pages in a shuffled pool, plus spare pages, and its block table; a
    page size that does not divide the capacity leaves the last page partly random."""
    batch, capacity, heads, dim = k_cache.shape
    per_seq = -(-capacity // page_size)
    pool = batch * per_seq + 3
    order = torch.randperm(pool)[: batch * per_seq].reshape(batch, per_seq).to(torch.int32)
    k_pages = torch.randn(pool, page_size, heads, dim).to(k_cache.dtype)  # (FP8 has no randn)
    v_pages = torch.randn(pool, page_size, heads, v_cache.shape[3]).to(v_cache.dtype)
    for b in range(batch):
        for p in range(per_seq):
            rows = slice(p * page_size, min((p + 1) * page_size, capacity))
            k_pages[order[b, p], :rows.stop - rows.start] = k_cache[b, rows]
            v_pages[order[b, p], :rows.stop - rows.start] = v_cache[b, rows]
    return k_pages, v_pages, order


def cache_in_layout(layout, batch, capacity, heads_kv, head_dim, dtype):
    """A (B, N, H, D) cache view: contiguous, head-major memory seen through a transpose, or
    starting one element into its storage (16-bit rows then miss 4-byte alignment)."""
    if layout == "head_major":
        return (torch.randn(batch, heads_kv, capacity, head_dim, dtype=dtype).transpose(1, 2),
                torch.randn(batch, heads_kv, capacity, head_dim, dtype=dtype).transpose(1, 2))
    if layout == "offset":
        size = batch * capacity * heads_kv * head_dim
        return tuple(torch.randn(size + 1, dtype=dtype)[1:].view(batch, capacity, heads_kv, head_dim)
                     for _ in range(2))
    return make_cache(batch, capacity, heads_kv, head_dim, dtype)


def paged_batch(lengths, heads_q, heads_kv, head_dim, page_size, dtype):
    """Packed queries, a shuffled page pool holding every sequence's keys, its block table,
    cu_seqlens_q, seqused_k, and the per-sequence tensors for the reference."""
    pages_per_seq = [-(-n_k // page_size) for _, n_k in lengths]
    width = max(pages_per_seq)
    pool = sum(pages_per_seq) + 3
    order = torch.randperm(pool).to(torch.int32)
    k_pages = torch.randn(pool, page_size, heads_kv, head_dim, dtype=dtype)
    v_pages = torch.randn(pool, page_size, heads_kv, head_dim, dtype=dtype)
    table = torch.zeros(len(lengths), width, dtype=torch.int32)
    used = 0
    seqs = []
    for b, ((n_q, n_k), count) in enumerate(zip(lengths, pages_per_seq)):
        table[b, :count] = order[used:used + count]
        used += count
        k = k_pages[table[b, :count].long()].flatten(0, 1)[:n_k]
        v = v_pages[table[b, :count].long()].flatten(0, 1)[:n_k]
        seqs.append((torch.randn(n_q, heads_q, head_dim, dtype=dtype), k, v))
    q = torch.cat([s[0] for s in seqs])
    cu_q = torch.tensor([0] + [n for n, _ in lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    seqused = torch.tensor([n for _, n in lengths], dtype=torch.int32)
    return q, k_pages, v_pages, table, cu_q, seqused, seqs
