"""KV caches, below flash_attn_with_kvcache and the paged serving call of flash_attn_varlen_func:
the append and cache-attention ops (cache_ops.py), the paged varlen op (paged_varlen.py), their
argument checks (checks.py), the launch plans of their decode steps (fast_calls.py),
cache_leftpad (leftpad.py), rotary embedding of the new tokens
(rotary.py) and FP8 caches (fp8_quant.py)."""
