"""Between the entry points and the compiled module (ipex_flash._C): the torch.library ops with
their fake and autograd implementations (attention.py: SDPA layout; flash_attn.py: flash-attn's
layouts), the checks every op shares (validation.py), the eager fast path (fast_path.py) with
the launch plans kept per call signature (launch_plans.py), and the launch helpers that turn
tensors into the host module's calls (launch.py). The KV-cache ops are in ipex_flash/kvcache/."""
