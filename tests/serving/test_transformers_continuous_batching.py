"""Continuous batching (generate_batch, ContinuousBatchingManager) on the transformers backend
(ipex_flash.integrations.transformers_paged) on tiny random fp32 models: greedy tokens identical
to each prompt's own eager generate() and, for the models that run SDPA, to transformers' sdpa
continuous batching. Each feature the kernels take (sliding window, softcap, sinks) changes the
reference tokens when it is removed, so a kernel that ignored it would fail."""
import pytest
import torch

transformers = pytest.importorskip(
    "transformers",
    reason="the backend's tests need transformers: pip install ipex_flash[transformers]",
)

import ipex_flash  # noqa: E402
from helpers.transformers_cases import (  # noqa: E402
    CASES, NEW_TOKENS, PROMPT_LENGTHS, SDPA_CASES, build, case_ids, cb_config, eager_tokens,
    generate_alone, generate_batch, generation_config, ipex_model, prompts)
from ipex_flash.integrations import transformers as backend  # noqa: E402
from ipex_flash.integrations import transformers_paged as paged  # noqa: E402


@pytest.fixture
def varlen_calls(monkeypatch):
    """The query lengths and key lengths of every sequence in each varlen kernel call."""
    calls = []
    real = ipex_flash.flash_attn_varlen_func

    def recording(q, k, v, cu_seqlens_q, cu_seqlens_k, *args, **kwargs):
        calls.append((cu_seqlens_q.diff().tolist(), cu_seqlens_k.diff().tolist()))
        return real(q, k, v, cu_seqlens_q, cu_seqlens_k, *args, **kwargs)

    monkeypatch.setattr(ipex_flash, "flash_attn_varlen_func", recording)
    return calls


# Tokens against transformers.


@pytest.mark.parametrize("case", CASES, ids=case_ids)
def test_generate_batch_matches_eager_generate(case, varlen_calls):
    got = generate_batch(ipex_model(case), prompts())
    want = eager_tokens(case)
    assert got == want, f"ipex continuous batching:\n{got}\neager generate:\n{want}"
    for feature in case.ablations:
        assert eager_tokens(case, feature) != want, f"{feature} does not change the tokens"
    # The kernels ran the steps, prefill chunks over cached keys among them.
    assert any(k > q > 1 for q_lens, k_lens in varlen_calls for q, k in zip(q_lens, k_lens))


@pytest.mark.parametrize("case", SDPA_CASES, ids=case_ids)
def test_generate_batch_matches_sdpa_continuous_batching(case):
    got = generate_batch(ipex_model(case), prompts())
    want = generate_batch(build(case, "sdpa"), prompts())
    assert got == want, f"ipex continuous batching:\n{got}\nsdpa continuous batching:\n{want}"


def test_manager_requests_arriving_while_others_decode(varlen_calls):
    """A ContinuousBatchingManager serving a first request, joined by two more once it decodes:
    the steps then mix their prefills with its decodes (Mistral: windows in every layer)."""
    case = CASES[2]
    model = ipex_model(case)
    first_prompt, *later_prompts = prompts()
    long_run = 5 * NEW_TOKENS  # the first request still decodes when the others arrive
    manager = model.init_continuous_batching(generation_config=generation_config(),
                                             continuous_batching_config=cb_config())
    manager.start()
    try:
        first = manager.add_request(first_prompt, max_new_tokens=long_run, streaming=True)
        results = {}
        for out in manager.request_id_iter(first):  # its first token: it decodes from now on
            assert not out.is_finished()
            break
        later = [manager.add_request(p, max_new_tokens=NEW_TOKENS) for p in later_prompts]
        for request_id in [first, *later]:
            for out in manager.request_id_iter(request_id):
                if out.is_finished():
                    assert out.error is None, out.error
                    results[request_id] = out.generated_tokens
                    break
    finally:
        manager.stop(block=True, timeout=30)
    reference = build(case, "sdpa")
    want = generate_alone(reference, [first_prompt], long_run) + generate_alone(reference,
                                                                                later_prompts)
    got = [results.get(request_id) for request_id in [first, *later]]
    assert got == want, f"ipex continuous batching:\n{got}\nsdpa generate:\n{want}"
    mixed = [q_lens for q_lens, _ in varlen_calls if 1 in q_lens and max(q_lens) > 1]
    assert mixed, "no step mixed a decode with a prefill"


def test_block_table_decode_writes_the_paged_cache(monkeypatch):
    """The decode fast path: transformers hands over the block table (it enables it on XPU and
    CUDA devices only, so the test claims an XPU device) and the kernels append to the paged
    cache themselves; the tokens stay those of sdpa continuous batching."""
    if paged.continuous_batching_name() != backend.PAGED_BACKEND:
        pytest.skip("transformers before 5.19 gives a block table to flash-attn names only")
    from transformers.generation.continuous_batching import initialization

    monkeypatch.setattr(initialization, "is_torch_xpu_available", lambda: True)
    calls = []
    real = ipex_flash.flash_attn_with_kvcache

    def recording(q, k_cache, v_cache, *args, **kwargs):
        calls.append(kwargs["block_table"].shape[0])
        return real(q, k_cache, v_cache, *args, **kwargs)

    monkeypatch.setattr(ipex_flash, "flash_attn_with_kvcache", recording)
    case = CASES[0]  # full attention only: sliding-window caches have no block table
    got = generate_batch(ipex_model(case), prompts())
    # Every request decodes NEW_TOKENS - 1 steps; the batches of 3 run on the block table.
    assert calls.count(len(PROMPT_LENGTHS)) >= case.make_config().num_hidden_layers
    assert got == generate_batch(build(case, "sdpa"), prompts())


# The name, generate(), errors.


def test_paged_backend_serves_generate_with_padding():
    case = CASES[3]  # Gemma 2: softcap and windows through the mask path
    model = build(case, backend.PAGED_BACKEND)
    eager = build(case, "eager")
    input_ids = torch.tensor([prompts()[0], [0] * 3 + prompts()[1]])
    attention_mask = (input_ids != 0).long()
    options = dict(attention_mask=attention_mask, max_new_tokens=NEW_TOKENS,
                   min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        got, want = model.generate(input_ids, **options), eager.generate(input_ids, **options)
    assert torch.equal(got, want), f"ipex:\n{got}\neager:\n{want}"


def test_names_and_flash_loader():
    assert backend.register() == backend.BACKEND
    assert "flash" in backend.PAGED_BACKEND and "flash" not in backend.BACKEND
    from transformers.utils.generic import is_flash_attention_requested
    # The flash-attn 2 check transformers makes before it hands a block table over.
    assert is_flash_attention_requested(requested_attention_implementation=backend.PAGED_BACKEND,
                                        version=2)
    interface = transformers.AttentionInterface()
    for name in (backend.PAGED_BACKEND, "paged|" + backend.BACKEND):
        assert interface[name] is paged.paged_attention_forward
    from transformers.modeling_flash_attention_utils import lazy_import_flash_attention
    functions = lazy_import_flash_attention(backend.PAGED_BACKEND)[0]
    assert functions[1] is ipex_flash.flash_attn_varlen_func
    backend.register()  # a second registration does not wrap the loader twice
    from transformers import modeling_flash_attention_utils as flash_utils
    assert not getattr(flash_utils._lazy_imports.__wrapped__, "ipex_flash_loader", False)


def test_bad_page_size_is_refused():
    q = torch.randn(1, 4, 2, 16)
    k = v = torch.randn(1, 2, 2, 16)
    k_cache = torch.zeros(4, 24, 2, 16)
    module = torch.nn.Module()
    with pytest.raises(ValueError, match="multiple of 16 up to 512, got 24"):
        paged.paged_attention_forward(
            module, q, k, v, None, k_cache=k_cache, v_cache=k_cache.clone(),
            block_table=torch.zeros(2, 1, dtype=torch.int32),
            cu_seq_lens_q=torch.tensor([0, 1, 2], dtype=torch.int32),
            cu_seq_lens_k=torch.tensor([0, 3, 6], dtype=torch.int32))


def test_backend_name_points_to_the_paged_name():
    with pytest.raises(NotImplementedError, match=backend.PAGED_BACKEND):
        backend.attention_forward(torch.nn.Module(), *(torch.randn(1, 2, 3, 16),) * 3, None,
                                  cache=object())
