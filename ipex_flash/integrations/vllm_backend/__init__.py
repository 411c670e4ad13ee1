"""vLLM's attention backend on ipex_flash: the class vLLM's engine runs every decoder layer's
attention through, on CPU tensors (the SYCL CPU device) and XPU tensors with the same code.

    IPEX_FLASH_VLLM=1 vllm serve MODEL         # in place of the platform's own backend
    vllm serve MODEL --attention-backend CUSTOM   # where the platform honours a choice

The switch is the `vllm.general_plugins` entry point (plugin.py), which vLLM loads in each of
its processes. Modules:

    plugin.py    the entry point: registers the backend, logs what it did, checks the setup
    backend.py   IpexFlashBackend: what vLLM asks of a backend (dtypes, block sizes, layouts)
    metadata.py  the per-step metadata and its builder
    impl.py      IpexFlashImpl: the cache write and the attention call of each layer

Only plugin.py is imported without vLLM; the others import it. See docs/serving.md.
"""
