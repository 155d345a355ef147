"""Softmax attention as an op beside the other sums over positions (as fla's ``ops/attn/`` beside
its layers): :func:`attention` over a sequence from its start in the call's context (causal, or
each document of a packed batch apart), and the KV caches that decoding writes and attends over
(:mod:`mcsd.ops.attention.cache`). Its kernels are PyTorch's (SDPA's fused ones, FlexAttention on
a GPU for documents apart) whatever ``model.kernels`` says. The projections, rotary embedding and
the choice of path are the mixer's (:mod:`mcsd.models.modules.attention`)."""

from __future__ import annotations

import torch

from mcsd.ops.attention.cache import KVCache, PaddedKVCache, ReadOnlyKVCache, StaticKVCache
from mcsd.ops.attention.causal import FUSED_WIDTH_MULTIPLE, biased_mask, causal_attention
from mcsd.ops.attention.documents import SHARED_SPAN_TOKENS, attend_document_spans, document_attention, document_spans
from mcsd.ops.common import document_index
from mcsd.ops.context import CHUNK, ForwardContext


def attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_bias: torch.Tensor | None = None,
    context: ForwardContext = CHUNK,
) -> torch.Tensor:
    """Causal attention of ``query``, ``key``, ``value`` ``[B, H, N, Dh]`` from the sequence's start,
    with an optional additive bias per key ``[B, H, N]``: each query attends to the keys up to
    itself, of its own document where ``context.starts`` says where documents start. Every form
    computes it alike (one fused call, no blocks): ``[B, H, N, Dh]``."""
    if context.starts is None:
        return causal_attention(query, key, value, key_bias)
    return document_attention(query, key, value, document_index(context.starts), key_bias)


__all__ = [
    "FUSED_WIDTH_MULTIPLE",
    "SHARED_SPAN_TOKENS",
    "KVCache",
    "PaddedKVCache",
    "ReadOnlyKVCache",
    "StaticKVCache",
    "attend_document_spans",
    "attention",
    "biased_mask",
    "causal_attention",
    "document_attention",
    "document_spans",
]
