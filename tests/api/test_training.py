"""A small attention layer trained for a few dozen steps with ipex_flash follows the same loss
curve as the same layer trained with torch SDPA."""
import pytest
import torch
import torch.nn.functional as F

import ipex_flash


class AttentionLayer(torch.nn.Module):
    def __init__(self, dim, heads, kv_heads, attention):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.attention = attention

    def forward(self, x):
        batch, seq, dim = x.shape
        # (B, N, H, D) transposed to (B, H, N, D): strided inputs, as in real models.
        q = self.q(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(batch, seq, 2, self.kv_heads, self.head_dim).unbind(2)
        out = self.attention(q, k.transpose(1, 2), v.transpose(1, 2))
        return self.proj(out.transpose(1, 2).reshape(batch, seq, dim))


def train(attention, steps=40):
    torch.manual_seed(0)
    layer = AttentionLayer(64, heads=4, kv_heads=2, attention=attention)
    optimizer = torch.optim.Adam(layer.parameters(), lr=3e-3)
    x = torch.randn(4, 50, 64)
    target = torch.randn(4, 50, 64)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(layer(x), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("causal", [False, True])
def test_loss_curve_matches_sdpa(causal):
    ours = train(lambda q, k, v: ipex_flash.attention(q, k, v, causal=causal))
    theirs = train(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                  enable_gqa=True))
    assert ours[-1] < 0.9 * ours[0], "the layer should learn"
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=1e-4, atol=1e-5)
