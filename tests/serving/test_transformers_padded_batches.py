"""Continuous-batching steps padded to fixed sizes, as transformers pads them when it compiles
a step or replays it from a graph (ModelRunner.pad_inputs): the batch is filled up with lanes
that hold no query token and no key (cu_seq_lens_q and cu_seq_lens_k repeat their last value,
the lane's block-table row is left at -1), and the packed queries and keys with rows past
the last sequence's. Real lanes are checked against float64, padded lanes' output rows must be
zeros, and nothing may be written into the cache for them; then whole generate_batch runs with
padding on give transformers' own tokens."""
import pytest
import torch

transformers = pytest.importorskip(
    "transformers",
    reason="the backend's tests need transformers: pip install ipex_flash[transformers]",
)

from helpers.engine_cases import reference, sequence_keys  # noqa: E402
from helpers.reference import OUTPUT_TOLERANCE  # noqa: E402
from helpers.transformers_cases import (  # noqa: E402
    CASES, PROMPT_LENGTHS, eager_tokens, generate_batch, ipex_model, prompts)
from ipex_flash.integrations import transformers as backend  # noqa: E402
from ipex_flash.integrations import transformers_paged as paged  # noqa: E402
from transformers.generation.configuration_utils import CompileConfig  # noqa: E402
from transformers.generation.continuous_batching import initialization, model_runner  # noqa: E402

HEADS_Q, HEADS_KV, HEAD_DIM, PAGE_SIZE = 4, 2, 16, 16
SCALE = HEAD_DIM ** -0.5
DTYPES = [torch.float32, torch.bfloat16]


def step_offsets(lengths):
    """transformers' cumulative lengths of a step, int32; padded lanes have length 0."""
    return torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)


def paged_cache(keys_per_lane, padded, dtype):
    """A paged cache whose pages are shuffled among the real lanes, and transformers' block
    table: -1 past each lane's pages, and all of a padded lane's row -1 but its first entry,
    which points at a real lane's page (a stale entry must not be written through either)."""
    width = max(-(-n // PAGE_SIZE) for n in keys_per_lane) + 1
    pool = len(keys_per_lane) * width
    k_cache = torch.randn(pool, PAGE_SIZE, HEADS_KV, HEAD_DIM).to(dtype)
    v_cache = torch.randn(pool, PAGE_SIZE, HEADS_KV, HEAD_DIM).to(dtype)
    pages = torch.randperm(pool).view(len(keys_per_lane), width)
    table = torch.full((len(keys_per_lane) + padded, width), -1, dtype=torch.int32)
    for lane, n in enumerate(keys_per_lane):
        used = -(-n // PAGE_SIZE)
        table[lane, :used] = pages[lane, :used].to(torch.int32)
    table[len(keys_per_lane):, 0] = table[0, 0]
    return k_cache, v_cache, table


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("padded", [1, 5])
def test_block_table_decode_with_padded_lanes(dtype, padded):
    """A decode step on the block table, padded as transformers pads it (to a power of two of
    lanes): cache_seqlens would be -1 in the padded lanes."""
    keys_per_lane = [17, 1, 40]  # with this step's key, appended at the end
    batch = len(keys_per_lane) + padded
    k_cache, v_cache, table = paged_cache(keys_per_lane, padded, dtype)
    query = torch.randn(1, HEADS_Q, batch, HEAD_DIM).to(dtype)
    key = torch.randn(1, HEADS_KV, batch, HEAD_DIM).to(dtype)
    value = torch.randn(1, HEADS_KV, batch, HEAD_DIM).to(dtype)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for lane, n in enumerate(keys_per_lane):
        page, slot = int(table[lane, (n - 1) // PAGE_SIZE]), (n - 1) % PAGE_SIZE
        want_k[page, slot], want_v[page, slot] = key[0, :, lane], value[0, :, lane]

    out, weights = paged.paged_attention_forward(
        torch.nn.Module(), query, key, value, None, scaling=SCALE, k_cache=k_cache,
        v_cache=v_cache, block_table=table, cu_seq_lens_q=step_offsets([1] * len(keys_per_lane)
                                                                       + [0] * padded),
        cu_seq_lens_k=step_offsets(keys_per_lane + [0] * padded), max_length_q=1,
        max_length_k=1)

    assert weights is None and out.shape == (1, batch, HEADS_Q, HEAD_DIM)
    # Exactly the real lanes' keys and values were written, nothing for the padded ones.
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    for lane, n in enumerate(keys_per_lane):
        ref, _ = reference(query[0, :, lane:lane + 1].transpose(0, 1).double(),
                           sequence_keys(want_k, table[lane], n).double(),
                           sequence_keys(want_v, table[lane], n).double())
        torch.testing.assert_close(out[0, lane:lane + 1].double(), ref, rtol=rtol, atol=atol)
    assert torch.equal(out[0, len(keys_per_lane):], torch.zeros_like(out[0, len(keys_per_lane):]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_step_with_padded_lanes_and_rows(dtype):
    """A step on the gathered keys (prefill chunks and decodes), padded to a fixed number of
    query rows, key rows and lanes: the rows past the last sequence are padding."""
    lengths_q, lengths_k = [5, 1, 3], [5, 9, 20]
    padded_lanes, rows_q, rows_k = 2, 16, 48
    cu_q = step_offsets(lengths_q + [0] * padded_lanes)
    cu_k = step_offsets(lengths_k + [0] * padded_lanes)
    query = torch.randn(1, HEADS_Q, rows_q, HEAD_DIM).to(dtype)
    key = torch.randn(1, HEADS_KV, rows_k, HEAD_DIM).to(dtype)
    value = torch.randn(1, HEADS_KV, rows_k, HEAD_DIM).to(dtype)

    out, _ = paged.paged_attention_forward(
        torch.nn.Module(), query, key, value, None, scaling=SCALE, cu_seq_lens_q=cu_q,
        cu_seq_lens_k=cu_k, max_length_q=rows_q, max_length_k=max(lengths_k))

    assert out.shape == (1, rows_q, HEADS_Q, HEAD_DIM)
    rtol, atol = OUTPUT_TOLERANCE[dtype]
    for lane in range(len(lengths_q)):
        rows, keys = (slice(int(cu[lane]), int(cu[lane + 1])) for cu in (cu_q, cu_k))
        ref, _ = reference(query[0, :, rows].transpose(0, 1).double(),
                           key[0, :, keys].transpose(0, 1).double(),
                           value[0, :, keys].transpose(0, 1).double())
        torch.testing.assert_close(out[0, rows].double(), ref, rtol=rtol, atol=atol)
    padding = out[0, sum(lengths_q):]
    assert torch.equal(padding, torch.zeros_like(padding))


# generate_batch with padding on, as transformers turns it on: by compiling its steps (here
# with dynamo's eager backend, which traces them and runs the traced graph without code
# generation). More lanes per step than there are prompts, so every step has padded lanes.
PADDED = dict(max_requests_per_batch=len(PROMPT_LENGTHS) + 1,
              varlen_compile_config=CompileConfig(backend="eager", mode=None, dynamic=False),
              decode_compile_config=CompileConfig(backend="eager", mode=None, dynamic=False))


@pytest.fixture
def padded_steps(monkeypatch):
    """(decode fast path, query tokens, after padding) of every step transformers runs."""
    steps = []
    real = model_runner.ModelRunner.maybe_pad_inputs

    def recording(self, num_q_tokens, max_kv_read, use_decode_fast_path):
        padded = real(self, num_q_tokens, max_kv_read, use_decode_fast_path)
        steps.append((use_decode_fast_path, num_q_tokens, padded[0]))
        return padded

    monkeypatch.setattr(model_runner.ModelRunner, "maybe_pad_inputs", recording)
    return steps


def test_padded_block_table_decodes_give_eager_tokens(monkeypatch, padded_steps):
    """Llama (full attention: decodes on the block table, which transformers enables on XPU and
    CUDA devices only, so the test claims an XPU device), 3 requests decoding in 4 lanes."""
    if paged.continuous_batching_name() != backend.PAGED_BACKEND:
        pytest.skip("transformers before 5.19 gives a block table to flash-attn names only")
    monkeypatch.setattr(initialization, "is_torch_xpu_available", lambda: True)
    case = CASES[0]
    got = generate_batch(ipex_model(case), prompts(), **PADDED)
    assert got == eager_tokens(case)
    assert any(decode and lanes > requests for decode, requests, lanes in padded_steps), \
        f"no decode step had a padded lane: {padded_steps}"


@pytest.mark.parametrize("case", [CASES[2], CASES[4]], ids=lambda case: case.name)
def test_padded_varlen_steps_give_eager_tokens(case, padded_steps):
    """Mistral and GPT-OSS (sliding windows, sinks: every step on the gathered keys), each
    step padded to 16 query rows in 4 lanes."""
    got = generate_batch(ipex_model(case), prompts(), **PADDED)
    assert got == eager_tokens(case)
    assert padded_steps and all(not decode for decode, _, _ in padded_steps)
    assert any(rows > tokens for _, tokens, rows in padded_steps), padded_steps
