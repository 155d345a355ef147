"""The attention op (mcsd/ops/attention/): its front in a call's context, each KV cache type's own
way of writing a token and attending (eager, at fixed addresses, a padded batch's, read-only)
against attention over the whole sequence, and its kernels for documents apart (SDPA over spans,
FlexAttention) against the block-diagonal mask, in fp64."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import pytest
from helpers.models import relative_rms_error

from mcsd.ops.attention import KVCache, PaddedKVCache, ReadOnlyKVCache, StaticKVCache, attention
from mcsd.ops.context import ForwardContext

DOCUMENT_LENGTHS = [1, 2, 63, 64, 65, 301]  # the conformance suite's packed documents


def document_position_ids(lengths: list[int]) -> torch.Tensor:
    """``[1, sum(lengths)]``: each token's position in its document (0 where one starts)."""
    return torch.cat([torch.arange(length) for length in lengths])[None]


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
    positions, the read-only cache (whose step leaves it unwritten and returns the entries) and
    a padded batch's cache at each row's own position give attention over the whole sequence,
    row by row. Each runtime is its cache's type: the eager one refuses a tensor position."""
    query, key, value, bias = inputs()
    expected = attention(query, key, value, bias)

    def empty(capacity: int) -> KVCache:
        return KVCache(torch.zeros(2, 3, capacity, 8, dtype=torch.float64), torch.zeros(2, 3, capacity, 8,
                       dtype=torch.float64), torch.zeros(2, 3, capacity, dtype=torch.float64))

    eager, static = empty(6), StaticKVCache.of(empty(11))
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
    with pytest.raises(TypeError, match="a KVCache steps at an int position"):
        eager.step(*token, torch.tensor(10))


def test_a_padded_batchs_cache_attends_each_row_from_its_own_start() -> None:
    """Row 0 padded by 2 positions, row 1 by none: each row's step at its own position equals
    attention over that row's own tokens alone."""
    query, key, value, bias = inputs()
    cache = KVCache(key[:, :, :6].clone(), value[:, :, :6].clone(), bias[:, :, :6].clone())
    padded = cache.last_document(torch.tensor([4, 6]))  # row 0's own tokens: positions 2..5
    assert isinstance(padded, PaddedKVCache) and padded.starts.tolist() == [2, 0]
    token = (query[:, :, 6], key[:, :, 6], value[:, :, 6], bias[:, :, 6:7])
    attended, same = padded.step(*token, torch.tensor([4, 6]))
    assert same is padded
    for row, start in enumerate((2, 0)):
        alone = attention(*(part[row:row + 1, :, start:7] for part in (query, key, value, bias)))
        torch.testing.assert_close(attended[row:row + 1, :, 0], alone[:, :, -1], rtol=1e-12, atol=1e-12)


def block_diagonal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, document: torch.Tensor,
                             key_bias: torch.Tensor | None) -> torch.Tensor:
    """Attention within documents by definition: one SDPA call with the block-diagonal causal mask
    ``[B, 1, N, N]`` (the key bias added where a key is visible)."""
    visible = ((document[:, :, None] == document[:, None, :]) & torch.ones(
        document.shape[1], document.shape[1], dtype=torch.bool).tril())[:, None]
    mask = visible if key_bias is None else key_bias[..., None, :].masked_fill(~visible, float("-inf"))
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)


@pytest.mark.parametrize("with_bias", [False, True], ids=["plain", "key_bias"])
def test_document_attention_over_spans_is_the_block_diagonal_mask(with_bias: bool) -> None:
    """The CPU's document attention (SDPA over spans of one long document or of short ones
    together, :func:`attend_document_spans`) gives the block-diagonal masked call's values and
    gradients (queries, keys, values, key bias) in fp64 to round-off: rows of one document, of
    127/128/129-token documents at the edge of sharing a span, of many one-token documents, and a
    row that begins inside a document (no start at position 0); the spans are the ones
    :func:`document_spans` says."""
    from mcsd.ops.attention import attend_document_spans, document_spans
    from mcsd.ops.common import document_index

    rows = [[540], [127, 1, 128, 129, 2, 63, 90], [1] * 300 + [240], DOCUMENT_LENGTHS + [540 - sum(DOCUMENT_LENGTHS)]]
    starts = torch.cat([document_position_ids(lengths) for lengths in rows]) == 0
    starts[-1, 0] = False  # the last row continues a document from before it
    document = document_index(starts)
    assert document_spans(document[1:2], 128) == [[127, 1], [128], [129], [2, 63, 90]]
    assert document_spans(document[2:3], 128) == [[1] * 128, [1] * 128, [1] * 44, [240]]
    query, key, value = (torch.randn(4, 3, 540, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    key_bias = -torch.rand(4, 3, 540, dtype=torch.float64, requires_grad=True) if with_bias else None
    inputs = [query, key, value] + ([key_bias] if with_bias else [])
    weights = torch.randn(4, 3, 540, 8, dtype=torch.float64)
    results = []
    for attend in (attend_document_spans, block_diagonal_attention):
        attended = attend(query, key, value, document, key_bias)
        results.append((attended, torch.autograd.grad((attended * weights).sum(), inputs)))
    (spans, span_grads), (masked, masked_grads) = results
    assert relative_rms_error(spans, masked) < 1e-12
    assert all(relative_rms_error(s, m) < 1e-12 for s, m in zip(span_grads, masked_grads))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # its eager form, on purpose
@pytest.mark.parametrize("with_bias", [False, True], ids=["plain", "key_bias"])
def test_fused_document_attention_is_the_block_diagonal_mask(with_bias: bool) -> None:
    """``document_attention(fused=True)`` (FlexAttention with the documents' block mask: a CUDA
    device's path, here its eager form on the CPU) computes the block-diagonal masked SDPA call's values, in fp64
    to round-off, for documents of lengths 1..365 that start inside and at the edges of its
    128-position blocks, with and without a bias per key (the hybrid's dynamic mask). FlexAttention
    has no backward on a CPU: the gradients are compared on a GPU (tests/gpu/test_gpu.py)."""
    from mcsd.ops.attention import document_attention
    from mcsd.ops.common import document_index

    position_ids = torch.cat([document_position_ids(DOCUMENT_LENGTHS), document_position_ids([128, 3, 365])])
    document = document_index(position_ids == 0)
    query, key, value = (torch.randn(2, 3, position_ids.shape[1], 8, dtype=torch.float64) for _ in range(3))
    key_bias = -torch.rand(2, 3, position_ids.shape[1], dtype=torch.float64) if with_bias else None
    fused = document_attention(query, key, value, document, key_bias, fused=True)
    assert relative_rms_error(fused, block_diagonal_attention(query, key, value, document, key_bias)) < 1e-12
