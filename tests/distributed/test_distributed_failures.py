"""What the distributed functions do when something is wrong: a rank that fails makes every
other rank raise within the group's timeout (never hang); bad or disagreeing arguments raise
a clear error on every rank; options that do not compose with the ring are refused."""
import time

from helpers import distributed_cases as dc
import pytest
import torch

from ipex_flash import distributed as ifd

TIMEOUT = 5  # seconds: the group's timeout in the failure tests


def _fail_at_exchange(rank, world, failing_rank, exchange_index, backward):
    """failing_rank raises just before posting its exchange number exchange_index (the
    forward makes P-1 exchanges, then the backward's first is a K/V send)."""
    from ipex_flash.distributed import _comm
    original = _comm.RingComm.exchange
    count = [0]

    def exchange(self, send, recv):
        if rank == failing_rank and count[0] == exchange_index:
            raise RuntimeError("injected failure before a send")
        count[0] += 1
        return original(self, send, recv)

    _comm.RingComm.exchange = exchange
    try:
        torch.manual_seed(3)
        q, k, v = (torch.randn(1, 16, 2, 16, requires_grad=True) for _ in range(3))
        out = ifd.zigzag_ring_flash_attn_func(q, k, v, causal=True)
        if backward:
            out.sum().backward()
    finally:
        _comm.RingComm.exchange = original


@pytest.mark.parametrize("size,failing_rank,exchange_index,backward", [
    (2, 1, 0, False),   # the forward's first send
    (4, 2, 3, True),    # the backward's first send
])
def test_failing_rank_makes_every_rank_raise(size, failing_rank, exchange_index, backward):
    world = dc.World(size, timeout=TIMEOUT)
    try:
        start = time.monotonic()
        answers = world.run_raw(_fail_at_exchange, timeout=TIMEOUT + 60, failing_rank=failing_rank,
                                exchange_index=exchange_index, backward=backward)
        elapsed = time.monotonic() - start
    finally:
        world.close(broken=True)
    for rank, (ok, result) in enumerate(answers):
        assert not ok, f"rank {rank} returned normally"
        kind, message, _ = result
        if rank == failing_rank:
            assert "injected failure" in message
        else:  # gloo's timeout, or the failed peer's closed connection
            assert kind == "RuntimeError", (rank, kind, message)
    # A rank left waiting would hang until the harness gave up (TIMEOUT + 60). The time includes
    # the ranks' first kernel builds, which on a loaded two-core machine took 49 s.
    assert elapsed < TIMEOUT + 60, elapsed


def _call(rank, world, api="ring_flash_attn_func", lengths=(8, 8), heads=None, **kwargs):
    """api on shards of lengths[rank] tokens with 2 heads (heads[rank] if given)."""
    h = 2 if heads is None else heads[rank]
    q = torch.randn(1, lengths[rank], h, 16)
    getattr(ifd, api)(q, q, q, **kwargs)


@pytest.mark.parametrize("kwargs,kind,words", [
    # Stripe's keys are world_size apart: no run of consecutive positions to place them at.
    (dict(api="stripe_flash_attn_func", causal=True, dropout_p=0.1), "NotImplementedError",
     "dropout_p > 0 is not supported"),
    (dict(api="stripe_flash_attn_func", causal=True, alibi_slopes=torch.ones(2)),
     "NotImplementedError", "alibi_slopes is not supported"),
    (dict(window_size=(3,)), "ValueError", "window_size"),
    (dict(softcap=-1.0), "ValueError", "softcap"),
    (dict(sinks=torch.ones(3)), "ValueError", "sinks"),
    (dict(heads=(2, 4)), "ValueError", "heads of q differs between the ranks"),
    (dict(api="zigzag_ring_flash_attn_func", lengths=(10, 6)), "ValueError", "zigzag_shard"),
])
def test_bad_input_raises_on_every_rank(world2, kwargs, kind, words):
    for ok, (got_kind, message, _) in world2.run_raw(_call, **kwargs):
        assert not ok and got_kind == kind and words in message, (got_kind, message)


def _disagreeing_causal(rank, world):
    q = torch.randn(1, 8, 2, 16)
    ifd.ring_flash_attn_func(q, q, q, causal=rank == 0)


def test_disagreeing_options_raise_on_every_rank(world2):
    """Every rank sees the all_gathered options, so all raise alike (none waits forever)."""
    for ok, (kind, message, _) in world2.run_raw(_disagreeing_causal):
        assert not ok and kind == "ValueError" and "causal differs" in message, message


def _unequal_q_and_k(rank, world):
    q, k = torch.randn(1, 8, 2, 16), torch.randn(1, 6, 2, 16)
    ifd.ring_flash_attn_func(q, k, k)


def test_q_and_k_of_different_tokens_refused(world2):
    for ok, (kind, message, _) in world2.run_raw(_unequal_q_and_k):
        assert not ok and kind == "ValueError" and "same tokens" in message


def test_uninitialized_process_group_refused():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ifd.ring_flash_attn_func(q, q, q)


def _context_parallel_layout(rank, world):
    """torch's context_parallel shards its buffers as zigzag_shard does (its head-tail load
    balancer), so its sharding can feed zigzag_ring_flash_attn_func."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    full = torch.randn(2, 32, 3)
    x = full.clone()
    with context_parallel(init_device_mesh("cpu", (world,)), buffers=[x], buffer_seq_dims=[1]):
        return torch.equal(x, ifd.zigzag_shard(full, rank, world))


def test_zigzag_layout_is_context_parallels(world2):
    assert world2.run(_context_parallel_layout) == [True, True]


def _override_inside_context_parallel(rank, world):
    """ipex_flash's SDPA override inside torch's context_parallel: raises, or computes the
    attention over the whole sequence (returns the error against it)."""
    import ipex_flash
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    torch.manual_seed(5)
    full = torch.randn(1, 2, 16, 16)  # (B, H, N, D): the sequence at dimension 2
    want = ifd.zigzag_shard(torch.nn.functional.scaled_dot_product_attention(
        full, full, full, is_causal=True), rank, world, dim=2)
    x = full.clone()
    ipex_flash.enable_sdpa_override()
    try:
        with context_parallel(init_device_mesh("cpu", (world,)), buffers=[x],
                              buffer_seq_dims=[2]):
            out = torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True)
        return dc.max_error(out, want)
    except Exception as error:  # noqa: BLE001  (a refusal is a correct answer)
        return type(error).__name__
    finally:
        ipex_flash.enable_sdpa_override(False)


def test_sdpa_override_inside_context_parallel_is_not_silently_wrong(world2):
    for answer in world2.run(_override_inside_context_parallel):
        assert isinstance(answer, str) or answer < 1e-5, answer
