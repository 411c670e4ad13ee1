"""The transformers adapter (substitute_hf_flash_attn, update_ring_flash_attn_params) at 2 and
4 gloo ranks on the SYCL CPU device: tiny random fp32 models (Llama with GQA, Mistral with a
sliding window shorter than its sequences, GPT-OSS with sinks) train on a packed batch
(position_ids restarting per sequence) whose token stream is split into equal contiguous
slices, one per rank. The loss and every parameter's gradient, summed over ranks, must match
one process running each sequence of the batch alone under transformers' sdpa (GPT-OSS:
eager) attention."""
import copy

from helpers import distributed_cases as dc
import pytest
import torch
import torch.distributed as dist

VOCAB = 96
MODELS = {
    "llama": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2)),
    "mistral": ("MistralConfig", dict(num_attention_heads=4, num_key_value_heads=1,
                                      sliding_window=7)),
    # Sinks, and sliding layers alternating with full ones; it refuses sdpa, so its one
    # process runs eager attention.
    "gpt_oss": ("GptOssConfig", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     sliding_window=7, num_local_experts=4,
                                     num_experts_per_tok=2,
                                     rope_parameters=dict(rope_type="default",
                                                          rope_theta=10000.0))),
}
LOSS_TOLERANCE = 1e-5   # relative
GRAD_TOLERANCE = 1e-5   # relative to the parameter's largest gradient


def _model(kind):
    import transformers

    config_class, heads = MODELS[kind]
    config = getattr(transformers, config_class)(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        max_position_embeddings=128, initializer_range=0.2, attention_dropout=0.0, **heads)
    torch.manual_seed(0)  # every rank builds the same weights
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager" if kind == "gpt_oss" else "sdpa")
    if kind == "gpt_oss":  # sinks large enough to matter (they start as small as any weight)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 1.0)
    return model


def _set_flash_name(model, name=None):
    """Puts the model under a flash name (default ipex_flash's) on every config, as
    enable_continuous_batching does: set_attn_implementation would swap a flash name GPT-OSS
    does not list for a Hub kernel, and refuses "flash_attention_2" without flash-attn."""
    import transformers
    from ipex_flash.integrations import transformers as ipex_transformers

    ipex_transformers.register()
    for module in model.modules():
        if isinstance(module, transformers.PreTrainedModel):
            module.config._attn_implementation = name or ipex_transformers.PAGED_BACKEND


def _batch(lengths):
    """input_ids and position_ids (1, N); targets: each token's next one within its sequence,
    -100 after a sequence's last token."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (1, sum(lengths)), generator=generator)
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    targets = torch.full_like(ids, -100)
    targets[:, :-1] = ids[:, 1:]
    ends = torch.tensor(lengths).cumsum(0) - 1
    targets[0, ends] = -100
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return ids, positions, targets, cu


def _loss_sum(model, ids, positions, targets):
    logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits[0], targets[0], ignore_index=-100,
                                             reduction="sum")


def adapter_case(rank, world, kind, lengths, heads_k_stride, name=None):
    """{"loss": relative error, parameter name: relative gradient error} of this rank's
    slice through the adapter (summed over ranks) against the whole batch in one process."""
    from ipex_flash.distributed.hf_adapter import (
        substitute_hf_flash_attn, update_ring_flash_attn_params)

    ids, positions, targets, cu = _batch(lengths)
    count = int((targets != -100).sum())
    single = _model(kind)
    sharded = copy.deepcopy(single)
    # One process runs each sequence alone: transformers' own packed-sequence masks do not
    # reach every model's layers (GPT-OSS's attend across the packed sequences).
    bounds = cu.tolist()
    want = sum(_loss_sum(single, *(t[:, a:b] for t in (ids, positions, targets)))
               for a, b in zip(bounds, bounds[1:])) / count
    want.backward()

    substitute_hf_flash_attn(dist.group.WORLD, heads_k_stride)
    _set_flash_name(sharded, name)
    update_ring_flash_attn_params(cu, dist.group.WORLD)
    per_rank = sum(lengths) // world
    part = slice(rank * per_rank, (rank + 1) * per_rank)
    loss = _loss_sum(sharded, ids[:, part], positions[:, part], targets[:, part]) / count
    loss.backward()
    dist.all_reduce(loss.detach())
    errors = {"loss": abs(loss.item() - want.item()) / abs(want.item())}
    for (name, p), (_, p_single) in zip(sharded.named_parameters(), single.named_parameters()):
        dist.all_reduce(p.grad)
        scale = p_single.grad.abs().max().item()
        errors[name] = dc.max_error(p.grad, p_single.grad) / max(scale, 1e-30)
    return errors


def _check(results):
    for rank, errors in enumerate(results):
        assert errors.pop("loss") <= LOSS_TOLERANCE, (rank, "loss")
        worst = max(errors, key=errors.get)
        assert errors[worst] <= GRAD_TOLERANCE, (rank, worst, errors[worst])


# 96 tokens: 48 per rank at 2, 24 at 4; sequences cross rank boundaries.
LENGTHS = [17, 40, 3, 36]


@pytest.mark.parametrize("kind,stride,name", [
    ("llama", 1, None), ("mistral", 1, None), ("gpt_oss", 1, None),
    ("llama", 2, "flash_attention_2"),  # the name upstream substitutes
])
def test_two_ranks(world2, kind, stride, name):
    _check(world2.run(adapter_case, kind=kind, lengths=LENGTHS, heads_k_stride=stride,
                      name=name))


def _refuses_padding(rank, world):
    """A padding mask cannot be sharded: the layer raises, naming attention_mask."""
    from ipex_flash.distributed.hf_adapter import (
        substitute_hf_flash_attn, update_ring_flash_attn_params)

    model = _model("llama")
    _set_flash_name(model)
    substitute_hf_flash_attn(dist.group.WORLD, 1)
    update_ring_flash_attn_params(torch.tensor([0, 16], dtype=torch.int32), dist.group.WORLD)
    mask = torch.ones(1, 8, dtype=torch.long)
    mask[0, :2] = 0
    try:
        model(input_ids=torch.zeros(1, 8, dtype=torch.long), attention_mask=mask)
    except ValueError as error:
        return "attention_mask" in str(error)
    return False


def test_padding_refused(world2):
    assert world2.run(_refuses_padding) == [True, True]


def _switched_off(rank, world):
    """use_ring_attn(False): the name runs what it ran before (ipex_flash's own attention, the
    packed sequences told apart by transformers' mask), on the whole batch on each rank."""
    from ipex_flash.distributed.hf_adapter import substitute_hf_flash_attn, use_ring_attn

    ids, positions, _, _ = _batch(LENGTHS)
    model = _model("llama")
    with torch.no_grad():
        want = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        substitute_hf_flash_attn(dist.group.WORLD, 1)
        _set_flash_name(model)
        use_ring_attn(False)
        try:
            got = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        finally:
            use_ring_attn(True)
    return dc.max_error(got, want) / want.abs().max().item()


def test_switched_off(world2):
    assert max(world2.run(_switched_off)) <= 1e-5


def test_four_ranks():
    world = dc.World(4)
    try:
        for kind, stride in (("llama", 2), ("mistral", 1)):
            _check(world.run(adapter_case, kind=kind, lengths=LENGTHS, heads_k_stride=stride))
    finally:
        world.close()
