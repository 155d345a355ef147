"""The attention op (mcsd/ops/attention/): its front in a call's context, and each KV cache's own
way of writing a token and attending (eager, at fixed addresses, read-only) against attention
over the whole sequence, in fp64."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mcsd.ops.attention import KVCache, ReadOnlyKVCache, attention
from mcsd.ops.context import ForwardContext


def inputs(length: int = 11) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    query, key, value = (torch.randn(2, 3, length, 8, dtype=torch.float64) for _ in range(3))
    return query, key, value, -torch.rand(2, 3, length, dtype=torch.float64)


def masked_attention(query, key, value, bias, visible):
    """SDPA with ``visible`` ``[B, N, N]`` and the key bias where a key is visible: the definition."""
    mask = bias[..., None, :].masked_fill(~visible[:, None], float("-inf"))
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask)


def test_attention_is_causal_and_keeps_the_contexts_documents_apart() -> None:
    query, key, value, bias = inputs()
    causal = torch.ones(11, 11, dtype=torch.bool).tril().expand(2, -1, -1)
    torch.testing.assert_close(attention(query, key, value, bias, ForwardContext.of("parallel")),
                               masked_attention(query, key, value, bias, causal), rtol=1e-12, atol=1e-12)
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3]])
    document = (position_ids == 0).cumsum(1)
    own = causal & (document[:, :, None] == document[:, None, :])
    apart = attention(query, key, value, bias, ForwardContext.of("chunk", position_ids=position_ids))
    torch.testing.assert_close(apart, masked_attention(query, key, value, bias, own), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(apart, attention(query, key, value, bias))


def test_each_cache_writes_and_attends_as_attention_over_the_sequence() -> None:
    """A prompt of 6 written and attended in blocks of 4, then a token per step: the eager cache
    at int positions (growing from a capacity of 6), the fixed-address cache at 0-d tensor
    positions, and the read-only cache (whose step leaves it unwritten and returns the entries)
    give attention over the whole sequence, row by row."""
    query, key, value, bias = inputs()
    expected = attention(query, key, value, bias)

    def empty(capacity: int) -> KVCache:
        return KVCache(torch.zeros(2, 3, capacity, 8, dtype=torch.float64), torch.zeros(2, 3, capacity, 8,
                       dtype=torch.float64), torch.zeros(2, 3, capacity, dtype=torch.float64))

    eager, static = empty(6), empty(11)
    for cache in (eager, static):
        prompt = cache.attend(query[:, :, :6], key[:, :, :6], value[:, :, :6], bias[:, :, :6], 0, 4)
        torch.testing.assert_close(prompt, expected[:, :, :6], rtol=1e-12, atol=1e-12)
    for position in range(6, 11):
        token = (query[:, :, position], key[:, :, position], value[:, :, position], bias[:, :, position:position + 1])
        read_only = ReadOnlyKVCache(static.keys.clone(), static.values.clone(), static.key_bias.clone())
        beside, entries = read_only.step(*token, torch.tensor(position))
        assert torch.equal(read_only.keys, static.keys) and torch.equal(entries.keys[:, :, 0], key[:, :, position])
        stepped, grown = eager.step(*token, position)
        fixed, same = static.step(*token, torch.tensor(position))
        assert grown is eager and same is static and static.capacity == 11
        for attended in (stepped, fixed, beside):
            torch.testing.assert_close(attended[:, :, 0], expected[:, :, position], rtol=1e-12, atol=1e-12)
    assert eager.capacity == 12  # grown twice its size once, at position 6
