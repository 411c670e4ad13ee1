"""Code shared by the tests (tests/ is on sys.path: pyproject.toml's pytest `pythonpath`), so
that no test file imports another; the fixtures every test can use stay in tests/conftest.py.

  cases          the dtypes, tiered (the default and `-m full` tiers of a grid), random_qkv,
                 PLAN_CALLS
  reference      tolerances against the float64 reference and the checks that use them
  caches         KV caches: contiguous, paged, in other memory layouts; a paged serving batch
  cache_checks   a cache's rows through its pages, the cache after an append, attention over
                 a cache's rows
  fp8            FP8 caches with their descales and the reference of the dequantised cache
  rotary         rotary embedding in float64 and the cache an append leaves
  flash_attn     flash-attn layouts, packing, options and its gradient check
  backward       the backward's gradient rule (twice torch SDPA's error plus a floor)
  sdpa           SDPA masks and its gradient check
  dropout        the reference under a reported dropout mask and its check
  matrix         the matrix-engine modes (IPEX_FLASH_MATRIX), the modes the matrix kernels' tests
                 run in, and the matrix_mode fixture
  engine_cases, vllm_cases, distributed_cases, property_cases, property_rule: the serving,
                 vLLM, distributed and property tests' own shared code
  transformers_cases  the continuous-batching tests' tiny models, prompts and generate calls
"""
