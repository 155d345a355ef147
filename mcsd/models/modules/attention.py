"""RoPE multi-head causal self-attention with a KV cache (the Transformer's mixer, and the
Wonderful Matrices hybrid's attention layers): the projections, the rotary embedding and the
choice of path; the attention itself and the caches are the attention op's
(:mod:`mcsd.ops.attention`).

Heads = ``num_channels``, head width = Dc. Its three forms:

- parallel: one causal SDPA call over the whole sequence (``is_causal=True``, no mask
  tensor: the training form, which allows the flash kernels on a GPU);
- chunk: queries in blocks of the context's ``chunk_size`` against the KV cache (chunked prefill);
- recurrent: one query at a time against the KV cache (decoding).

The KV cache is preallocated for the prompt plus ``max_new_tokens`` and written in place.
When a write would pass its end it grows to twice its capacity (or to what the write
needs), so decoding any number of tokens costs amortised O(1) copies per token.
"""

from __future__ import annotations

import torch
from torch import nn

from mcsd.models.config import LMConfig
from mcsd.models.modules.mixer import TokenMixer
from mcsd.models.modules.rotary import rotary, rotary_step
from mcsd.ops.attention import KVCache, attention
from mcsd.ops.context import ForwardContext
from mcsd.ops.flops import attention_flops


class CausalSelfAttention(TokenMixer):
    """Multi-head causal self-attention with RoPE and a KV cache. Initialisation: Normal(0,
    init_std) projections; ``out_proj`` writes into the residual stream (the skeleton scales
    it to init_std / sqrt(2 L)). ``config`` is any architecture's config with a ``rope_base``
    (the Transformer's, the hybrid's)."""

    state_rewinds = True  # the KV cache holds each position's key and value
    separates_documents = True  # a mask of each query's own document, rotary from each document's start

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.num_heads = config.num_channels
        self.head_width = config.channel_width
        self.rope_base = config.rope_base
        self.init_std = config.init_std
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.qkv_proj.weight, std=self.init_std)
        nn.init.normal_(self.out_proj.weight, std=self.init_std)

    def residual_weights(self) -> list[nn.Parameter]:
        return [self.out_proj.weight]

    def init_state(self, batch_size: int, capacity: int, device: torch.device, dtype: torch.dtype) -> KVCache:
        shape = (batch_size, self.num_heads, capacity, self.head_width)
        return KVCache(torch.empty(shape, device=device, dtype=dtype), torch.empty(shape, device=device, dtype=dtype))

    def sequence_flops(self, length: int, context: ForwardContext) -> int:
        width = self.num_heads * self.head_width
        return attention_flops(length, width, width, context.form, context.chunk_size)

    def key_bias(self, value: torch.Tensor) -> torch.Tensor | None:
        """An additive bias per key on the attention scores, ``[B, H, N]`` from the values
        ``[B, H, N, Dh]``; plain attention has none."""
        return None

    def forward(
        self, x: torch.Tensor, cache: KVCache | None, position: int, context: ForwardContext,
    ) -> tuple[torch.Tensor, KVCache | None]:
        if context.position_ids is not None:
            if position != 0:
                raise ValueError("documents apart (position_ids) start from no state: attention has no way to "
                                 "continue a cache into a packed batch")
            return self._documents_apart(x, context)
        form = context.form
        batch, length, hidden = x.shape
        query, key, value = self._projected(x)
        query = rotary(query, position, self.rope_base)
        key = rotary(key, position, self.rope_base)
        bias = self.key_bias(value)
        if form == "parallel" and cache is None:
            attended = attention(query, key, value, bias, context)
        else:
            # From no cache (training, a model's hidden states), the chunk form attends in one
            # fused causal call (:func:`~mcsd.ops.attention.causal_attention`): no scores are kept, and ``torch.compile``
            # takes one graph for every length (a loop over blocks would unroll at each length).
            # The parallel form into a cache does the same (one call, masked past position 0): the
            # prefill an ONNX export traces once for every prompt length (mcsd.deploy.onnx).
            block = 1 if form == "recurrent" else None if form == "parallel" or cache is None else context.chunk_size
            if cache is None:
                cache = self.init_state(batch, position + length, x.device, key.dtype)
            attended = cache.attend(query, key, value, bias, position, block)
        return self.out_proj(attended.transpose(1, 2).reshape(batch, length, hidden)), cache

    def _projected(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The queries, keys and values of ``x`` ``[B, N, D]``, each ``[B, H, N, Dh]`` (views of one projection)."""
        batch, length, _ = x.shape
        qkv = self.qkv_proj(x).view(batch, length, 3, self.num_heads, self.head_width)
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)

    def _documents_apart(self, x: torch.Tensor, context: ForwardContext) -> tuple[torch.Tensor, KVCache]:
        """Every form with ``context``'s documents apart: rotary at each token's
        position in its document, each query attending to the keys of its own document up to
        itself (:func:`~mcsd.ops.attention.document_attention`). The cache returned holds every position;
        :meth:`last_document` keeps the last document's for decoding.

        Compiled on a CPU, the graph breaks at the spans' call and every tensor then alive in the
        calling frames leaves the graph: the projection is made in :meth:`_projected`, whose frame
        has returned by then (with its 5-d view ``qkv`` alive in :meth:`forward`, inductor's graph
        of the hybrid replayed that output with garbage sizes on its next call, torch 2.13)."""
        batch, length, _ = x.shape
        query, key, value = self._projected(x)
        query, key = (rotary(part, context.position_ids, self.rope_base) for part in (query, key))
        bias = self.key_bias(value)
        attended = attention(query, key, value, bias, context)
        cache = KVCache(key, value, bias)
        return self.out_proj(attended.transpose(1, 2).reshape(batch, length, -1)), cache

    def last_document(self, cache: KVCache, length: int | torch.Tensor) -> KVCache:
        """The cache of a packed run's last ``length`` positions (its last document's) at positions
        ``0..length-1``: what decoding that document on reads. Lengths ``[B]`` (a padded batch,
        each row's own): every position kept, each row's attended from its own start on."""
        return cache.last_document(length)

    def step(
        self, x: torch.Tensor, cache: KVCache | None, position: int | torch.Tensor, context: ForwardContext
    ) -> tuple[torch.Tensor, KVCache]:
        """One token per row, ``x`` ``[B, D]``: its key and value (and key bias) written into the
        cache in place, its query attending to every cached position (none is in its future).
        How the token is written and attended is the cache type's own :meth:`~mcsd.ops.attention.KVCache.step`: an eager cache
        grows at an ``int`` position, a :class:`~mcsd.ops.attention.StaticKVCache` keeps its size
        at a 0-d tensor one (the step at fixed addresses), a padded batch's
        (:class:`~mcsd.ops.attention.PaddedKVCache`) steps each row at its own, and a
        :class:`~mcsd.ops.attention.ReadOnlyKVCache` is read, not written, the token's entries
        returned in its place."""
        batch, hidden = x.shape
        qkv = self.qkv_proj(x).view(batch, 3, self.num_heads, self.head_width)
        query, key = rotary_step(qkv[:, :2], position, self.rope_base).unbind(1)  # [B, H, Dh] each
        value = qkv[:, 2]
        bias = self.key_bias(value[:, :, None])
        if cache is None:
            cache = self.init_state(batch, position + 1, x.device, key.dtype)
        attended, cache = cache.step(query, key, value, bias, position)
        return self.out_proj(attended.reshape(batch, hidden)), cache
