"""Hypothesis strategies for the property tests: the problems each entry point is drawn on,
per tier. Every distinct (dtype, compiled head dim, score features, kernel) compiles a kernel
variant the first time (seconds on the CPU device), so the default tier draws from what the
parametrized tests compile anyway (head dims that pad to 64; softcap and ALiBi only with the
dtypes whose backward they compile) and the full tier from everything. A drawn case is a
dict; its `seed` makes its tensors, so a printed falsifying example reproduces alone."""
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Tier:
    head_dims: st.SearchStrategy
    max_len: int           # longest query or key sequence
    feature_dtypes: tuple  # dtypes drawn with softcap and ALiBi
    examples: int          # hypothesis max_examples of each property


# Lengths either side of the tile sizes (64 query rows and keys; 16 and 32 in the decode
# kernel), 0 where the entry point takes empty sequences, and anything up to the tier's longest.
def lengths(tier, low=1):
    edges = [n for n in (0, 1, 2, 15, 17, 31, 33, 63, 65, 127, 129) if low <= n <= tier.max_len]
    return st.one_of(st.sampled_from(edges), st.integers(low, tier.max_len))


DEFAULT = Tier(
    head_dims=st.integers(49, 64),  # all compile as 64
    max_len=130,
    feature_dtypes=(torch.float32, torch.bfloat16),
    examples=6,
)
FULL = Tier(
    head_dims=st.one_of(st.sampled_from([1, 16, 59, 80, 111, 128, 192, 256]),
                        st.integers(1, 256)),
    max_len=300,
    feature_dtypes=DTYPES,
    examples=25,
)
TIERS = {"default": DEFAULT, "full": FULL}

seeds = st.integers(0, 2**31 - 1)
windows = st.one_of(st.just((-1, -1)), st.tuples(st.integers(-1, 40), st.integers(-1, 40)))
softcaps = st.sampled_from([0.0, 0.0, 2.5, 30.0])


@st.composite
def heads(draw):
    """(heads_q, heads_kv): MHA, GQA and MQA."""
    heads_kv = draw(st.integers(1, 2))
    return heads_kv * draw(st.sampled_from([1, 2, 3, 4])), heads_kv


@st.composite
def score_options(draw, tier, dtype):
    """causal, window, softcap, ALiBi and sinks as flash-attn's functions take them."""
    features = dtype in tier.feature_dtypes
    return dict(causal=draw(st.booleans()), window=draw(windows),
                softcap=draw(softcaps) if features else 0.0,
                alibi=draw(st.booleans()) if features else False, sinks=draw(st.booleans()))


@st.composite
def flash_attn_cases(draw, tier):
    dtype = draw(st.sampled_from(DTYPES))
    heads_q, heads_kv = draw(heads())
    return dict(dtype=dtype, batch=draw(st.integers(1, 2)), heads_q=heads_q, heads_kv=heads_kv,
                len_q=draw(lengths(tier)), len_k=draw(lengths(tier)),
                head_dim=draw(tier.head_dims), **draw(score_options(tier, dtype)),
                seed=draw(seeds))


@st.composite
def sdpa_cases(draw, tier):
    """Masks through ipex_flash.scaled_dot_product_attention: bool or additive (float32 or
    the query's dtype), full or broadcast over batch and heads, with SDPA's top-left causal."""
    dtype = draw(st.sampled_from(DTYPES))
    heads_q, heads_kv = draw(heads())
    mask = draw(st.sampled_from(["none", "bool", "float32", "dtype"]))
    return dict(dtype=dtype, batch=draw(st.integers(1, 2)), heads_q=heads_q, heads_kv=heads_kv,
                len_q=draw(lengths(tier)), len_k=draw(lengths(tier)),
                head_dim=draw(tier.head_dims), mask=mask,
                mask_shape=draw(st.sampled_from(["full", "per_batch", "shared"])),
                hidden_fraction=draw(st.sampled_from([0.0, 0.3, 0.9, 1.0])),
                is_causal=draw(st.booleans()),
                softcap=draw(softcaps) if dtype in tier.feature_dtypes else 0.0,
                sinks=draw(st.booleans()), seed=draw(seeds))


@st.composite
def varlen_cases(draw, tier, paged=False):
    """Packed sequences, zero-length ones included: (len_q, len_k) per sequence; paged: the
    keys live in a paged cache of page_size."""
    dtype = draw(st.sampled_from(DTYPES))
    heads_q, heads_kv = draw(heads())
    seq_lens = draw(st.lists(st.tuples(lengths(tier, low=0), lengths(tier, low=0)),
                             min_size=1, max_size=4))
    case = dict(dtype=dtype, heads_q=heads_q, heads_kv=heads_kv, seq_lens=seq_lens,
                head_dim=draw(tier.head_dims), **draw(score_options(tier, dtype)),
                seed=draw(seeds))
    if paged:
        case["page_size"] = draw(st.sampled_from([16, 48, 64, 256]))
    return case


@st.composite
def kvcache_cases(draw, tier):
    """flash_attn_with_kvcache over a paged cache: a few new tokens per sequence, appended
    (new k, v) or already in the cache, on caches of 0 keys upwards."""
    dtype = draw(st.sampled_from(DTYPES))
    heads_q, heads_kv = draw(heads())
    batch = draw(st.integers(1, 3))
    new_tokens = draw(st.sampled_from([1, 1, 2, 5, 17, 40]))
    append = draw(st.booleans())
    capacity = draw(lengths(tier)) + (new_tokens if append else 0)
    cached = draw(st.lists(st.integers(0, capacity - (new_tokens if append else 0)),
                           min_size=batch, max_size=batch))
    return dict(dtype=dtype, batch=batch, heads_q=heads_q, heads_kv=heads_kv,
                len_q=new_tokens, append=append, capacity=capacity, cache_seqlens=cached,
                head_dim=draw(tier.head_dims), page_size=draw(st.sampled_from([16, 48, 64, 256])),
                **draw(score_options(tier, dtype)), seed=draw(seeds))
