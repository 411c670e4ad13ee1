"""Hypothesis strategies for the property tests: the problems each entry point is drawn on,
per tier. Every distinct (dtype, compiled head dim, score features, kernel, decode rows)
compiles a kernel variant the first time (seconds on the CPU device), so the default tier
draws from the families the parametrized tests compile anyway (head dims that compile as 64,
their GQA ratios, one query row or more than the decode kernel takes, softcap and ALiBi only
where those tests run them) and the full tier from everything. A drawn case is a dict; its
`seed` makes its tensors, so a printed falsifying example reproduces alone."""
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NO_FP16 = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class Tier:
    max_len: int               # longest query or key sequence
    head_dims: st.SearchStrategy
    heads: st.SearchStrategy   # (heads_q, heads_kv)
    cache_heads: st.SearchStrategy  # the same for the KV-cache entry points
    short_queries: bool        # queries of 2-32 tokens (the decode kernel's row counts)
    dtypes: dict               # entry point -> dtypes drawn
    feature_dtypes: dict       # entry point -> dtypes drawn with softcap and ALiBi
    examples: int              # hypothesis max_examples of each property


def lengths(tier, low=1):
    """Lengths either side of the tile sizes (64 query rows and keys; 16 and 32 in the decode
    kernel), 0 where the entry point takes empty sequences, and any up to the tier's longest."""
    edges = [n for n in (0, 1, 2, 15, 17, 31, 33, 63, 65, 127, 129) if low <= n <= tier.max_len]
    return st.one_of(st.sampled_from(edges), st.integers(low, tier.max_len))


def query_lengths(tier):
    """Query lengths where the decode kernel may serve (its variants depend on the rows)."""
    if tier.short_queries:
        return lengths(tier, low=0)
    return st.one_of(st.sampled_from([0, 1, 1, 1]), st.integers(33, tier.max_len))


@st.composite
def any_heads(draw):
    """MHA, GQA and MQA."""
    heads_kv = draw(st.integers(1, 2))
    return heads_kv * draw(st.sampled_from([1, 2, 3, 4])), heads_kv


ENTRY_POINTS = ("flash_attn", "sdpa", "varlen", "paged_varlen", "kvcache")
DEFAULT = Tier(
    max_len=130,
    head_dims=st.integers(49, 64),
    heads=st.just((4, 2)),
    cache_heads=st.just((8, 2)),
    short_queries=False,
    dtypes=dict(flash_attn=DTYPES, sdpa=NO_FP16, varlen=DTYPES,
                paged_varlen=NO_FP16, kvcache=DTYPES),
    # The general kernels' softcap and ALiBi variants serve flash_attn and varlen alike; the
    # decode kernel's, over caches, are left to the full tier.
    feature_dtypes=dict(flash_attn=NO_FP16, sdpa=(), varlen=NO_FP16, paged_varlen=(),
                        kvcache=()),
    examples=6,
)
FULL = Tier(
    max_len=300,
    # Odd head dims that compile as the full grids' sizes (16, 64, 96, 128, 256).
    head_dims=st.one_of(st.integers(1, 16), st.integers(49, 64), st.integers(81, 96),
                        st.integers(113, 128), st.integers(225, 256)),
    heads=any_heads(),
    cache_heads=any_heads(),
    short_queries=True,
    dtypes={name: DTYPES for name in ENTRY_POINTS},
    feature_dtypes={name: DTYPES for name in ENTRY_POINTS},
    examples=10,
)
TIERS = {"default": DEFAULT, "full": FULL}

seeds = st.integers(0, 2**31 - 1)
windows = st.one_of(st.just((-1, -1)), st.tuples(st.integers(-1, 40), st.integers(-1, 40)))
softcaps = st.sampled_from([0.0, 0.0, 2.5, 30.0])


@st.composite
def score_options(draw, tier, entry_point, dtype):
    """causal, window, softcap, ALiBi and sinks as flash-attn's functions take them."""
    features = dtype in tier.feature_dtypes[entry_point]
    return dict(causal=draw(st.booleans()), window=draw(windows),
                softcap=draw(softcaps) if features else 0.0,
                alibi=draw(st.booleans()) if features else False, sinks=draw(st.booleans()))


@st.composite
def flash_attn_cases(draw, tier):
    dtype = draw(st.sampled_from(tier.dtypes["flash_attn"]))
    heads_q, heads_kv = draw(tier.heads)
    return dict(dtype=dtype, batch=draw(st.integers(1, 2)), heads_q=heads_q, heads_kv=heads_kv,
                len_q=draw(query_lengths(tier)), len_k=draw(lengths(tier, low=0)),
                head_dim=draw(tier.head_dims), **draw(score_options(tier, "flash_attn", dtype)),
                seed=draw(seeds))


@st.composite
def sdpa_cases(draw, tier):
    """Masks through ipex_flash.scaled_dot_product_attention: bool or additive (float32 or
    the query's dtype), full or broadcast over batch and heads, with SDPA's top-left causal."""
    dtype = draw(st.sampled_from(tier.dtypes["sdpa"]))
    heads_q, heads_kv = draw(tier.heads)
    features = dtype in tier.feature_dtypes["sdpa"]
    mask = draw(st.sampled_from(["none", "bool", "float32"] + (["dtype"] if features else [])))
    return dict(dtype=dtype, batch=draw(st.integers(1, 2)), heads_q=heads_q, heads_kv=heads_kv,
                len_q=draw(query_lengths(tier)), len_k=draw(lengths(tier, low=0)),
                head_dim=draw(tier.head_dims), mask=mask,
                mask_shape=draw(st.sampled_from(["full", "per_batch", "shared"])),
                hidden_fraction=draw(st.sampled_from([0.0, 0.3, 0.9, 1.0])),
                is_causal=draw(st.booleans()), softcap=draw(softcaps) if features else 0.0,
                sinks=draw(st.booleans()), seed=draw(seeds))


@st.composite
def varlen_cases(draw, tier):
    """Packed sequences of (len_q, len_k) each, empty ones included."""
    dtype = draw(st.sampled_from(tier.dtypes["varlen"]))
    heads_q, heads_kv = draw(tier.heads)
    seq_lens = draw(st.lists(st.tuples(lengths(tier, low=0), lengths(tier, low=0)),
                             min_size=1, max_size=4))
    return dict(dtype=dtype, heads_q=heads_q, heads_kv=heads_kv, seq_lens=seq_lens,
                head_dim=draw(tier.head_dims), **draw(score_options(tier, "varlen", dtype)),
                seed=draw(seeds))


@st.composite
def paged_varlen_cases(draw, tier):
    """The serving call's batches: per sequence, new tokens (decodes of 1 and a few tokens,
    prefills, none) and its keys in a paged cache of page_size."""
    dtype = draw(st.sampled_from(tier.dtypes["paged_varlen"]))
    heads_q, heads_kv = draw(tier.cache_heads)
    new_tokens = lengths(tier, low=0) if tier.short_queries else st.one_of(
        st.sampled_from([0, 1, 1, 3]), st.integers(33, tier.max_len))
    seq_lens = draw(st.lists(st.tuples(new_tokens, lengths(tier, low=0)), min_size=1,
                             max_size=4))
    return dict(dtype=dtype, heads_q=heads_q, heads_kv=heads_kv, seq_lens=seq_lens,
                head_dim=draw(tier.head_dims), page_size=draw(st.sampled_from([16, 48, 64, 256])),
                **draw(score_options(tier, "paged_varlen", dtype)), seed=draw(seeds))


@st.composite
def kvcache_cases(draw, tier):
    """flash_attn_with_kvcache over a paged cache: a few new tokens per sequence, appended
    (new k, v) or already in the cache, on caches of 0 keys upwards."""
    dtype = draw(st.sampled_from(tier.dtypes["kvcache"]))
    heads_q, heads_kv = draw(tier.cache_heads)
    batch = draw(st.integers(1, 3))
    new_tokens = draw(st.sampled_from([1, 1, 2, 3, 5, 17, 20, 33, 40] if tier.short_queries
                                      else [1, 1, 3, 20, 40]))
    append = draw(st.booleans())
    capacity = draw(lengths(tier)) + (new_tokens if append else 0)
    cached = draw(st.lists(st.integers(0, capacity - (new_tokens if append else 0)),
                           min_size=batch, max_size=batch))
    return dict(dtype=dtype, batch=batch, heads_q=heads_q, heads_kv=heads_kv,
                len_q=new_tokens, append=append, capacity=capacity, cache_seqlens=cached,
                head_dim=draw(tier.head_dims), page_size=draw(st.sampled_from([16, 48, 64, 256])),
                **draw(score_options(tier, "kvcache", dtype)), seed=draw(seeds))
