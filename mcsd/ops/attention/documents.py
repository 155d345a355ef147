"""Causal attention within each document of a packed batch: FlexAttention with the documents'
block mask on a GPU, SDPA over spans of documents elsewhere."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.attention.flex_attention as flex
import torch.nn.functional as F

from mcsd.ops.attention.causal import causal_attention

def document_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, document: torch.Tensor,
    key_bias: torch.Tensor | None = None, fused: bool | None = None,
) -> torch.Tensor:
    """Causal attention within each document of a packed batch: ``query``, ``key``, ``value``
    ``[B, H, N, Dh]``, ``document`` ``[B, N]`` (each position's document, non-decreasing), an
    optional additive bias per key ``[B, H, N]``. Each query attends to the keys of its own
    document up to itself.

    ``fused`` (by default on a CUDA device): FlexAttention with a block mask of the documents,
    compiled (blocks of 128 x 128 positions that no document spans are skipped, fully visible
    ones run unmasked, and no ``N x N`` mask is made); otherwise SDPA over each document
    (:func:`attend_document_spans`: the CPU's path, as FlexAttention has no backward on a CPU,
    and its forward is fused there only through an inductor compile)."""
    if fused is None:
        fused = query.is_cuda
    if not fused:
        return attend_document_spans(query, key, value, document, key_bias)
    batch, _, length, _ = query.shape

    def own_document_causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (q >= kv) & (document[b, q] == document[b, kv])

    def add_key_bias(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
                     kv: torch.Tensor) -> torch.Tensor:
        return score + key_bias[b, h, kv].to(score.dtype)

    block_mask = flex.create_block_mask(own_document_causal, batch, None, length, length, device=query.device,
                                        _compile=query.is_cuda)
    attend = _compiled_flex_attention() if query.is_cuda else flex.flex_attention
    return attend(query, key, value, score_mod=None if key_bias is None else add_key_bias, block_mask=block_mask)


SHARED_SPAN_TOKENS = 128
"""Documents shorter than this share an SDPA call with their short neighbours (a block-diagonal
mask over fewer than twice this many positions), so that a batch of many short documents is not
as many calls; a longer document is a call of its own, with no mask."""


def document_spans(document: torch.Tensor, shared_span_tokens: int = SHARED_SPAN_TOKENS) -> list[list[int]]:
    """The spans :func:`attend_document_spans` attends over, row after row of ``document``
    ``[B, N]`` (non-decreasing): each span is the list of the lengths of the consecutive documents
    it holds. A document of ``shared_span_tokens`` or more is a span alone; shorter ones are
    gathered until their span reaches that many tokens (or the row ends)."""
    batch, length = document.shape
    starts = torch.ones_like(document, dtype=torch.bool)
    starts[:, 1:] = document[:, 1:] != document[:, :-1]
    row_starts: list[list[int]] = [[] for _ in range(batch)]
    for row, column in starts.nonzero().tolist():
        row_starts[row].append(column)
    spans: list[list[int]] = []
    for columns in row_starts:
        shared: list[int] = []
        for start, end in zip(columns, columns[1:] + [length]):
            if end - start >= shared_span_tokens:
                spans.extend([shared, [end - start]] if shared else [[end - start]])
                shared = []
            else:
                shared.append(end - start)
                if sum(shared) >= shared_span_tokens:
                    spans.append(shared)
                    shared = []
        if shared:
            spans.append(shared)
    return spans


@torch.compiler.disable  # its calls follow where the documents start: data, not shapes
def attend_document_spans(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, document: torch.Tensor,
    key_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`document_attention` through SDPA, one call per span of :func:`document_spans`
    (the rows end to end, heads first): a span of one document in SDPA's fused causal kernel
    (:func:`causal_attention`), one of short documents with their block-diagonal causal mask. The
    work is each document's own triangle, where one masked call over the row would compute all
    ``N x N`` scores (experiments/train_throughput/documents_* measures it against joined)."""
    batch, heads, length, _ = query.shape
    spans = document_spans(document)
    sizes = [sum(span) for span in spans]

    def spans_of(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # [1, H, span, ...]: SDPA's fused CPU kernels take 4-d inputs (3-d ones fall back to the
        # math kernel, which makes each span's [L, L] scores)
        return x.transpose(0, 1).reshape(1, heads, batch * length, *x.shape[3:]).split(sizes, dim=2)

    biases = spans_of(key_bias) if key_bias is not None else [None] * len(spans)
    attended = []
    for span, span_query, span_key, span_value, span_bias in zip(
            spans, spans_of(query), spans_of(key), spans_of(value), biases):
        if len(span) == 1:
            attended.append(causal_attention(span_query, span_key, span_value, span_bias))
            continue
        own = torch.repeat_interleave(torch.arange(len(span), device=query.device),
                                      torch.tensor(span, device=query.device))
        visible = (own[:, None] == own[None, :]).tril()
        mask = visible if span_bias is None else span_bias[..., None, :].masked_fill(~visible, float("-inf"))
        attended.append(F.scaled_dot_product_attention(span_query, span_key, span_value, attn_mask=mask))
    return torch.cat(attended, dim=2).view(heads, batch, length, -1).transpose(0, 1)


@functools.cache
def _compiled_flex_attention() -> Callable:
    """FlexAttention through ``torch.compile`` (its fused kernel; called eagerly it computes the
    scores in full), compiled once per process; inside a compiled model dynamo traces it in place."""
    return torch.compile(flex.flex_attention, dynamic=False)
