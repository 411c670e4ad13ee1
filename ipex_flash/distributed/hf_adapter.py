"""ring-flash-attention's transformers adapter on ipex_flash: training a transformers model
with its packed token stream split into equal contiguous slices over a process group, the
attention running llama3_flash_attn_varlen_func.

    from ipex_flash.distributed.hf_adapter import (
        substitute_hf_flash_attn, update_ring_flash_attn_params)
    from ipex_flash.integrations import transformers as ipex_transformers

    model = AutoModelForCausalLM.from_pretrained(
        path, attn_implementation=ipex_transformers.PAGED_BACKEND)   # or "flash_attention_2"
    substitute_hf_flash_attn(group, heads_k_stride=1)
    for batch in loader:               # input_ids (1, N) packed, position_ids restarting at 0
        update_ring_flash_attn_params(batch_cu_seqlens, group)       # the whole batch's
        sl = slice(rank * N // P, (rank + 1) * N // P)
        logits = model(input_ids[:, sl], position_ids=position_ids[:, sl]).logits

Upstream replaces transformers' "flash_attention_2" attention function (and, for releases
before 5, the module-level _flash_attention_forward, which transformers 5 imports by name
and no longer looks up at call time). Here the replacement covers two names: "flash_attention_2",
which transformers loads only where flash-attn or the kernels package is installed, and
ipex_flash's own flash name (ipex_transformers.PAGED_BACKEND), which loads anywhere once
ipex_flash's transformers backend is registered (substitute_hf_flash_attn registers it).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from ipex_flash.distributed._comm import resolve_group
from ipex_flash.distributed.llama3 import (
    llama3_flash_attn_prepare_cu_seqlens, llama3_flash_attn_varlen_func)

Tensor = torch.Tensor
# The batch's offsets as this rank sees them, set by update_ring_flash_attn_params and read
# by every attention layer of the next forward (module state, as upstream's).
DATA_PARAMS: dict = {}
RING_ATTN_SWITCH = True
FLASH_NAME = "flash_attention_2"


def update_ring_flash_attn_params(cu_seqlens: Tensor, process_group: dist.ProcessGroup) -> None:
    """Describes the next forward's packed batch: cu_seqlens (batch + 1,) integers, the offsets
    of its sequences in the whole token stream (every rank passes the same), whose length
    must be a multiple of the group size. Causal attention (decoder models)."""
    fn = "ipex_flash.distributed.update_ring_flash_attn_params"
    group = resolve_group(fn, process_group)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if isinstance(cu_seqlens, torch.Tensor):  # the kernels take int32 offsets
        cu_seqlens = cu_seqlens.to(torch.int32)
    cu_q, cu_k, max_q, max_k, k_slice = llama3_flash_attn_prepare_cu_seqlens(
        cu_seqlens, True, rank, world)
    DATA_PARAMS.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                       max_seqlen_k=max_k, local_k_slice=k_slice)


def use_ring_attn(flag: bool) -> None:
    """False: the substituted names run the attention they ran before substitute_hf_flash_attn
    (e.g. for evaluation on whole sequences); True again restores the ring."""
    global RING_ATTN_SWITCH
    RING_ATTN_SWITCH = bool(flag)


def _ring_attention_forward(process_group, heads_k_stride):
    """transformers' attention-function contract: query (1, Hq, n, D), key and value
    (1, Hkv, n, D) in, (1, n, Hq, Dv) out, no attention weights."""

    def attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                  attention_mask: Optional[Tensor], dropout: float = 0.0,
                  scaling: Optional[float] = None, sliding_window: Optional[int] = None,
                  softcap: Optional[float] = None, is_causal: Optional[bool] = None,
                  s_aux: Optional[Tensor] = None, **kwargs):
        fn = "ipex_flash.distributed.substitute_hf_flash_attn"
        if attention_mask is not None:
            # The flash mask function returns a mask only for padding, which this rank's
            # slice of the stream cannot describe to the other ranks.
            raise ValueError(f"{fn}: got an attention_mask with padding; pack the sequences "
                             "without padding (position_ids restarting at 0 for each) and "
                             "describe them with update_ring_flash_attn_params")
        if not (module.is_causal if is_causal is None else is_causal):
            raise NotImplementedError(f"{fn}: only causal attention is supported "
                                      "(update_ring_flash_attn_params prepares causal offsets)")
        if query.shape[0] != 1:
            raise ValueError(f"{fn}: the packed sequences must come as one batch row, got "
                             f"query of shape {tuple(query.shape)}")
        if not DATA_PARAMS:
            raise RuntimeError(f"{fn}: call update_ring_flash_attn_params(cu_seqlens, "
                               "process_group) before the model's forward")
        # transformers' sliding_window counts the query's own key.
        window = (-1, -1) if sliding_window is None else (sliding_window - 1, 0)
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (n, heads, dim)
        out = llama3_flash_attn_varlen_func(
            q, k, v, heads_k_stride=heads_k_stride, dropout_p=dropout, softmax_scale=scaling,
            causal=True, window_size=window, group=process_group,
            softcap=0.0 if softcap is None else softcap, sinks=s_aux, **DATA_PARAMS)
        return out.unsqueeze(0), None

    return attention


def _switched(ring, previous):
    """The ring while RING_ATTN_SWITCH is on, else what the name ran before."""
    def dispatch(*args, **kwargs):
        return (ring if RING_ATTN_SWITCH else previous)(*args, **kwargs)
    return dispatch


def substitute_hf_flash_attn(process_group: dist.ProcessGroup, heads_k_stride: int) -> None:
    """Makes every transformers model running under "flash_attention_2" or
    ipex_transformers.PAGED_BACKEND attend over the packed batch that
    update_ring_flash_attn_params describes, sharded over process_group, through
    llama3_flash_attn_varlen_func with heads_k_stride K/V heads gathered at a time (it must
    divide the model's K/V heads). Causal self-attention, windows (Mistral, Qwen's sliding
    layers), softcap (Gemma 2) and sinks (GPT-OSS; their gradient is each rank's part, summed
    over ranks with the other gradients). Attention dropout (a model in training mode with
    attention_dropout > 0) is passed on, and keeps what one process's call over the packed
    batch keeps for the same seed (seed every rank alike). Calling it again replaces the
    group and the stride."""
    fn = "ipex_flash.distributed.substitute_hf_flash_attn"
    group = resolve_group(fn, process_group)
    if not isinstance(heads_k_stride, int) or isinstance(heads_k_stride, bool) \
            or heads_k_stride < 1:
        raise ValueError(f"{fn}: heads_k_stride must be a positive int, got {heads_k_stride!r}")
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        from ipex_flash.integrations import transformers as ipex_transformers
    except ImportError as error:
        raise ImportError(f"{fn} needs Hugging Face transformers (>= 5.0): "
                          "pip install ipex_flash[transformers]") from error
    ipex_transformers.register()
    ring = _ring_attention_forward(group, heads_k_stride)
    for name in (FLASH_NAME, ipex_transformers.PAGED_BACKEND):
        # The function the name ran before the first substitution: its class-wide entry
        # (set by register functions) is never changed here, only this instance's override.
        previous = type(ALL_ATTENTION_FUNCTIONS)._global_mapping[name]
        ALL_ATTENTION_FUNCTIONS[name] = _switched(ring, previous)
    # Under the ring, ipex_flash's name takes flash-attn's masks (none unless there is
    # padding) instead of its materialised SDPA masks.
    name = ipex_transformers.PAGED_BACKEND
    ALL_MASK_ATTENTION_FUNCTIONS[name] = _switched(
        flash_attention_mask, type(ALL_MASK_ATTENTION_FUNCTIONS)._global_mapping[name])
