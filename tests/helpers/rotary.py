"""Rotary embedding in float64 and what flash_attn_with_kvcache's append with rotary gives:
the reference of kvcache/test_kvcache_api.py, also used by kvcache/test_decode_append.py,
kvcache/test_kvcache_leftpad.py and kvcache/test_kvcache_call_plans.py."""
import ipex_flash  # noqa: F401  (imported before torch, see _runtime.py)
import torch
from ipex_flash.reference import flash_attn_reference


def rotate64(x, angles, interleaved):
    """x (..., D) in float64 with its first 2 * angles.shape[-1] features rotated by `angles`
    (broadcast against x's leading dims), written with complex numbers."""
    half = angles.shape[-1]
    rot = x[..., :2 * half].double()
    if interleaved:
        pairs = torch.complex(rot[..., 0::2], rot[..., 1::2])
    else:
        pairs = torch.complex(rot[..., :half], rot[..., half:])
    turned = pairs * torch.polar(torch.ones_like(angles), angles)
    if interleaved:
        out = torch.stack((turned.real, turned.imag), dim=-1).flatten(-2)
    else:
        out = torch.cat((turned.real, turned.imag), dim=-1)
    return torch.cat((out, x[..., 2 * half:].double()), dim=-1)


def expected(q, k_cache, v_cache, k_new, v_new, seqlens, rows, causal, angles=None,
             interleaved=True, window=(-1, -1)):
    """Per sequence b: the cache row rows[b] after the append (k rotated at positions
    seqlens[b] + i), attended by q (rotated likewise when causal or local, else at
    seqlens[b]) over its first seqlens[b] + new keys."""
    outs = []
    new = k_new.shape[1]
    local = causal or window != (-1, -1)
    for b, (start, row) in enumerate(zip(seqlens.tolist(), rows)):
        k = k_cache[row].double().clone()
        v = v_cache[row].double().clone()
        kb, qb = k_new[b].double(), q[b].double()
        if angles is not None:
            positions = torch.arange(start, start + new)
            kb = rotate64(kb, angles[positions][:, None, :], interleaved)
            q_positions = (torch.arange(start, start + q.shape[1]) if local
                           else torch.full((q.shape[1],), start))
            qb = rotate64(qb, angles[q_positions][:, None, :], interleaved)
        k[start:start + new], v[start:start + new] = kb, v_new[b].double()
        out, _ = flash_attn_reference(qb[None], k[None, :start + new], v[None, :start + new],
                                      causal, window)
        outs.append(out[0])
    return torch.stack(outs)
