"""Checks shared by the KV-cache tests: a cache's rows through its pages, the cache expected
after an append, and attention over a cache's rows against the float64 reference."""
import itertools

import torch

from helpers.reference import OUTPUT_TOLERANCE, check_against_reference


def check(out, ref, dtype):
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)


def sequence_rows(cache, table, b, rows):
    """Sequence b's cache rows `rows` (a slice of positions), through its pages if paged."""
    if table is None:
        return cache[b, rows]
    read = -(-rows.stop // cache.shape[1])  # (entries past them are never read)
    return cache[table[b, :read].long()].flatten(0, 1)[rows]


def after_append(cache, table, lengths, new):
    """The cache with new (B, Nnew, H, D) written at positions lengths[b] + i, and nowhere
    else."""
    expected = cache.clone()
    for b, i in itertools.product(range(new.shape[0]), range(new.shape[1])):
        position = int(lengths[b]) + i
        if table is None:
            expected[b, position] = new[b, i]
        else:
            page_size = cache.shape[1]
            expected[table[b, position // page_size].long(), position % page_size] = new[b, i]
    return expected


def check_cache_attention(out, lse, q, caches, table, starts, ends, dtype):
    """Sequence b's causal output and LSE against the reference over its cache rows
    starts[b] .. ends[b] of caches (k, v)."""
    for b in range(q.shape[0]):
        rows = slice(int(starts[b]), int(ends[b]))
        keys, values = (sequence_rows(c, table, b, rows) for c in caches)
        check_against_reference(out[b:b + 1], lse[b:b + 1], q[b:b + 1], keys[None],
                                values[None], [keys.shape[0]], dtype, causal=True)
