"""RoPE multi-head causal self-attention with a KV cache (the Transformer's mixer, and the
Wonderful Matrices hybrid's attention layers).

Heads = ``num_channels``, head width = Dc, attention through
``torch.nn.functional.scaled_dot_product_attention``. Its three forms:

- parallel: one causal SDPA call over the whole sequence (``is_causal=True``, no mask
  tensor: the training form, which allows the flash kernels on a GPU);
- chunk: queries in blocks of ``chunk_size`` against the KV cache (chunked prefill);
- recurrent: one query at a time against the KV cache (decoding).

The KV cache is preallocated for the prompt plus ``max_new_tokens`` and written in place.
When a write would pass its end it grows to twice its capacity (or to what the write
needs), so decoding any number of tokens costs amortised O(1) copies per token.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch
import torch.nn.attention.flex_attention as flex
import torch.nn.functional as F
from torch import nn

from mcsd.models.config import LMConfig
from mcsd.models.modules.mixer import TokenMixer
from mcsd.models.modules.rotary import rotary, rotary_step
from mcsd.ops.context import ForwardContext
from mcsd.ops.common import document_index
from mcsd.ops.flops import attention_flops


@dataclasses.dataclass
class KVCache:
    """One layer's preallocated keys and values, ``[B, H, capacity, Dh]`` each, and, for an
    attention with a per-key score bias (the Wonderful Matrices' dynamic mask), that bias
    ``[B, H, capacity]``."""

    keys: torch.Tensor
    values: torch.Tensor
    key_bias: torch.Tensor | None = None
    # A padded batch's rows (``[B]``): where each row's own tokens start; the positions before
    # (its padding, the earlier documents of a packed prompt) are never attended to.
    starts: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def with_capacity(self, capacity: int) -> KVCache:
        """A zero-filled cache of the same rows, heads and dtype with room for ``capacity`` positions."""
        return KVCache(*(None if old is None else old.new_zeros(*old.shape[:2], capacity, *old.shape[3:])
                         for old in self._fields()))

    def prefix(self, capacity: int) -> KVCache:
        """A view of the first ``capacity`` positions: writes to it land in this cache."""
        return KVCache(*(None if old is None else old[:, :, :capacity] for old in self._fields()))

    def copy_positions_(self, other: KVCache, count: int) -> None:
        """Copy ``other``'s first ``count`` positions into this cache's."""
        for mine, theirs in zip(self._fields(), other._fields()):
            if mine is not None:
                mine[:, :, :count] = theirs[:, :, :count]

    def zero_positions_from_(self, start: int) -> None:
        """Zero every position from ``start`` on (an entry never written may hold a NaN, which a
        masked attention over the whole capacity would still multiply by 0)."""
        for mine in self._fields():
            if mine is not None:
                mine[:, :, start:] = 0

    def _fields(self) -> list[torch.Tensor | None]:
        """The tensors with an entry per position (``starts`` has one per row)."""
        return [self.keys, self.values, self.key_bias]

    def reserve(self, end: int, filled: int) -> None:
        """Make room for positions up to ``end``: grow geometrically, keeping the ``filled``
        positions written so far."""
        if end <= self.capacity:
            return
        capacity = max(end, 2 * self.capacity)
        for field in ("keys", "values", "key_bias"):
            old = getattr(self, field)
            if old is None:
                continue
            new = old.new_empty(*old.shape[:2], capacity, *old.shape[3:])
            new[:, :, :filled] = old[:, :, :filled]
            setattr(self, field, new)


@dataclasses.dataclass
class ReadOnlyKVCache(KVCache):
    """A KV cache that a step at a 0-d tensor position reads and does not write: what an ONNX
    export's step is given (:mod:`mcsd.deploy.onnx`). The step attends over the positions before
    its own (the rest masked) and to its own key and value beside them, and returns its token's
    entries (a :class:`KVCache` of one position) for the caller to write at the position: in a
    graph a write into an input copies the whole cache at every step, where the runner writes the
    one position in place."""


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
            attended = causal_attention(query, key, value, bias)
        else:
            # From no cache (training, a model's hidden states), the chunk form attends in one
            # fused causal call (:func:`causal_attention`): no scores are kept, and ``torch.compile``
            # takes one graph for every length (a loop over blocks would unroll at each length).
            # The parallel form into a cache does the same (one call, masked past position 0): the
            # prefill an ONNX export traces once for every prompt length (mcsd.deploy.onnx).
            block = 1 if form == "recurrent" else None if form == "parallel" or cache is None else context.chunk_size
            if cache is None:
                cache = self.init_state(batch, position + length, x.device, key.dtype)
            attended = self._attend_cached(query, key, value, bias, cache, position, block)
        return self.out_proj(attended.transpose(1, 2).reshape(batch, length, hidden)), cache

    def _projected(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The queries, keys and values of ``x`` ``[B, N, D]``, each ``[B, H, N, Dh]`` (views of one projection)."""
        batch, length, _ = x.shape
        qkv = self.qkv_proj(x).view(batch, length, 3, self.num_heads, self.head_width)
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)

    def _documents_apart(self, x: torch.Tensor, context: ForwardContext) -> tuple[torch.Tensor, KVCache]:
        """Every form with ``context``'s documents apart: rotary at each token's
        position in its document, each query attending to the keys of its own document up to
        itself (:func:`document_attention`). The cache returned holds every position;
        :meth:`last_document` keeps the last document's for decoding.

        Compiled on a CPU, the graph breaks at the spans' call and every tensor then alive in the
        calling frames leaves the graph: the projection is made in :meth:`_projected`, whose frame
        has returned by then (with its 5-d view ``qkv`` alive in :meth:`forward`, inductor's graph
        of the hybrid replayed that output with garbage sizes on its next call, torch 2.13)."""
        batch, length, _ = x.shape
        query, key, value = self._projected(x)
        query, key = (rotary(part, context.position_ids, self.rope_base) for part in (query, key))
        bias = self.key_bias(value)
        attended = document_attention(query, key, value, document_index(context.starts), bias)
        cache = KVCache(key, value, bias)
        return self.out_proj(attended.transpose(1, 2).reshape(batch, length, -1)), cache

    def last_document(self, cache: KVCache, length: int | torch.Tensor) -> KVCache:
        """The cache of a packed run's last ``length`` positions (its last document's) at positions
        ``0..length-1``: what decoding that document on reads. Lengths ``[B]`` (a padded batch,
        each row's own): every position kept, each row's attended from its own start on."""
        if isinstance(length, torch.Tensor):
            return dataclasses.replace(cache, starts=cache.keys.shape[2] - length)
        return KVCache(*(None if part is None else part[:, :, -length:].clone() for part in cache._fields()))

    def step(
        self, x: torch.Tensor, cache: KVCache | None, position: int | torch.Tensor, context: ForwardContext
    ) -> tuple[torch.Tensor, KVCache]:
        """One token per row, ``x`` ``[B, D]``: its key and value (and key bias) written into the
        cache in place, its query attending to every cached position (none is in its future).
        With ``position`` a 0-d tensor (the step at fixed addresses), the cache keeps its size:
        the token is written at ``position`` and the query attends over the whole capacity,
        the positions after it masked out (:meth:`_attend_static`); a :class:`ReadOnlyKVCache`
        is read, not written, and the token's entries are returned in its place."""
        batch, hidden = x.shape
        qkv = self.qkv_proj(x).view(batch, 3, self.num_heads, self.head_width)
        query, key = rotary_step(qkv[:, :2], position, self.rope_base).unbind(1)  # [B, H, Dh] each
        value = qkv[:, 2]
        bias = self.key_bias(value[:, :, None])
        if isinstance(cache, ReadOnlyKVCache):
            entries = KVCache(key[:, :, None].to(cache.keys.dtype), value[:, :, None].to(cache.values.dtype),
                              None if bias is None else bias.to(cache.key_bias.dtype))
            attended = self._attend_beside(query, entries, cache, position)
            return self.out_proj(attended.reshape(batch, hidden)), entries
        if isinstance(position, torch.Tensor) and position.dim() == 1:
            attended = self._attend_rows(query, key, value, bias, cache, position)
            return self.out_proj(attended.reshape(batch, hidden)), cache
        if isinstance(position, torch.Tensor):
            attended = self._attend_static(query, key, value, bias, cache, position)
            return self.out_proj(attended.reshape(batch, hidden)), cache
        if cache is None:
            cache = self.init_state(batch, position + 1, x.device, key.dtype)
        end = position + 1
        cache.reserve(end, filled=position)
        # Slices, not integer indices: a compiled step keeps ``position`` symbolic through them.
        cache.keys[:, :, position:end] = key[:, :, None].to(cache.keys.dtype)
        cache.values[:, :, position:end] = value[:, :, None].to(cache.values.dtype)
        mask = None
        if bias is not None:
            cache.key_bias[:, :, position:end] = bias.to(cache.key_bias.dtype)
            mask = cache.key_bias[:, :, None, :end].to(query.dtype)
        attended = F.scaled_dot_product_attention(query[:, :, None], cache.keys[:, :, :end].to(query.dtype),
                                                  cache.values[:, :, :end].to(query.dtype), attn_mask=mask)
        return self.out_proj(attended.reshape(batch, hidden)), cache

    @staticmethod
    def _attend_rows(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None, cache: KVCache,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """One query per row ``[B, H, Dh]`` of a padded batch, row b at its own ``positions[b]``
        (its rotary angle): the token written at the cache's next index (``starts + positions``,
        the same for every row), attending to the row's own keys from ``cache.starts`` on."""
        index = int(cache.starts[0] + positions[0])
        end = index + 1
        cache.reserve(end, filled=index)
        cache.keys[:, :, index:end] = key[:, :, None].to(cache.keys.dtype)
        cache.values[:, :, index:end] = value[:, :, None].to(cache.values.dtype)
        own = torch.arange(end, device=query.device)[None, :] >= cache.starts[:, None]  # [B, end]
        mask = own[:, None, None, :]
        if bias is not None:
            cache.key_bias[:, :, index:end] = bias.to(cache.key_bias.dtype)
            mask = cache.key_bias[:, :, None, :end].to(query.dtype).masked_fill(~mask, float("-inf"))
        return F.scaled_dot_product_attention(query[:, :, None], cache.keys[:, :, :end].to(query.dtype),
                                              cache.values[:, :, :end].to(query.dtype), attn_mask=mask)

    @staticmethod
    def _attend_static(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None, cache: KVCache,
        position: torch.Tensor,
    ) -> torch.Tensor:
        """One query per row ``[B, H, Dh]`` at the 0-d tensor ``position``: its key and value (and
        key bias) written into ``cache`` at ``position``, attending over the cache's whole capacity
        with the positions after it masked (an entry never written must hold finite numbers:
        :class:`~mcsd.models.cuda_graphs.StaticStep` allocates zeros). No shape or Python
        branch depends on the position: what a CUDA graph replays at every position."""
        index = position.reshape(1)
        cache.keys.index_copy_(2, index, key[:, :, None].to(cache.keys.dtype))
        cache.values.index_copy_(2, index, value[:, :, None].to(cache.values.dtype))
        visible = (torch.arange(cache.capacity, device=query.device) <= position)[None]  # [1, capacity]
        if bias is None:
            mask = visible
        else:
            cache.key_bias.index_copy_(2, index, bias.to(cache.key_bias.dtype))
            mask = cache.key_bias[:, :, None, :].to(query.dtype).masked_fill(~visible, float("-inf"))
        return F.scaled_dot_product_attention(query[:, :, None], cache.keys.to(query.dtype),
                                              cache.values.to(query.dtype), attn_mask=mask)

    @staticmethod
    def _attend_beside(query: torch.Tensor, entries: KVCache, cache: KVCache, position: torch.Tensor) -> torch.Tensor:
        """One query per row ``[B, H, Dh]`` at the 0-d tensor ``position`` attending over ``cache``'s
        positions before it (the rest masked, never written to) and its own ``entries`` (one
        position) beside them, in one softmax: :meth:`_attend_static`'s numbers without writing
        the cache. ``[B, H, 1, Dh]``."""
        scale = query.shape[-1] ** -0.5
        query = query[:, :, None]
        past = query @ cache.keys.to(query.dtype).transpose(-1, -2) * scale  # [B, H, 1, capacity]
        own = query @ entries.keys.to(query.dtype).transpose(-1, -2) * scale  # [B, H, 1, 1]
        if cache.key_bias is not None:
            past = past + cache.key_bias[:, :, None, :].to(query.dtype)
            own = own + entries.key_bias[:, :, None, :].to(query.dtype)
        before = (torch.arange(cache.capacity, device=query.device) < position)[None, None, None]
        scores = torch.cat([past.masked_fill(~before, float("-inf")), own], -1)
        weights = torch.softmax(scores, -1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(query.dtype)
        return (weights[..., :-1] @ cache.values.to(query.dtype)
                + weights[..., -1:] * entries.values.to(query.dtype))

    def _attend_cached(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
        cache: KVCache, position: int, block: int | None,
    ) -> torch.Tensor:
        """Write keys/values (and key biases) into the cache, then attend query blocks of
        ``block`` tokens (all at once if None) to everything before them."""
        length = query.shape[2]
        end = position + length
        cache.reserve(end, filled=position)
        cache.keys[:, :, position:end] = key.to(cache.keys.dtype)
        cache.values[:, :, position:end] = value.to(cache.values.dtype)
        if bias is not None:
            cache.key_bias[:, :, position:end] = bias.to(cache.key_bias.dtype)
        if block is None:
            keys, values = cache.keys[:, :, :end].to(query.dtype), cache.values[:, :, :end].to(query.dtype)
            if position == 0:  # from the sequence's start: the fused causal kernel, no [N, N] mask
                return causal_attention(query, keys, values, None if bias is None else cache.key_bias[:, :, :end])
            if bias is not None:
                mask = biased_mask(cache.key_bias[:, :, :end].to(query.dtype), position, length)
            else:  # query i (absolute position + i) sees keys <= itself
                mask = torch.arange(position, end, device=query.device)[:, None] >= torch.arange(
                    end, device=query.device)[None, :]
            return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask)
        outputs = []
        for start in range(0, length, block):
            stop = min(start + block, length)
            visible = position + stop
            keys = cache.keys[:, :, :visible].to(query.dtype)
            values = cache.values[:, :, :visible].to(query.dtype)
            if bias is not None:
                mask = biased_mask(cache.key_bias[:, :, :visible].to(query.dtype), position + start, stop - start)
            elif stop - start > 1:  # query i (absolute position + start + i) sees keys <= itself
                rows = torch.arange(position + start, visible, device=query.device)
                mask = rows[:, None] >= torch.arange(visible, device=query.device)[None, :]
            else:
                mask = None
            outputs.append(F.scaled_dot_product_attention(query[:, :, start:stop], keys, values, attn_mask=mask))
        return torch.cat(outputs, dim=2)


FUSED_WIDTH_MULTIPLE = 8
"""The fused GPU attention kernels (flash, memory-efficient, cuDNN) take 16-bit heads whose width
is a multiple of 8; any other width falls back to the math kernel and its full ``N x N`` scores."""


def causal_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Causal attention of ``query``, ``key``, ``value`` ``[B, H, N, Dh]`` from position 0, with an
    optional additive bias per key ``[B, H, N]``, through SDPA's fused causal kernel. The bias is
    folded into one more feature, ``s q.k + b = s [q, 1].[k, b / s]`` (``s`` the usual
    ``Dh^-1/2``), so no ``[N, N]`` mask is made (at 16384 tokens the hybrid's mask and its
    gradient took 16 GB); the heads are padded with zero features to the next multiple of
    :data:`FUSED_WIDTH_MULTIPLE` (the values too: the kernels want one width), which a fused GPU
    kernel takes (``Dh + 1`` would not)."""
    if key_bias is None:
        return F.scaled_dot_product_attention(query, key, value, is_causal=True)
    width = query.shape[-1]
    scale = width**-0.5
    padding = -(width + 1) % FUSED_WIDTH_MULTIPLE  # zero features after the bias's

    def padded(x: torch.Tensor, *features: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, *features, x.new_zeros(*x.shape[:-1], padding)], dim=-1)

    query = padded(query, torch.ones_like(query[..., :1]))
    key = padded(key, (key_bias / scale).to(key.dtype)[..., None])
    value = padded(value, torch.zeros_like(value[..., :1]))
    return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale)[..., :width]


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


def biased_mask(key_bias: torch.Tensor, first_query: int, num_queries: int) -> torch.Tensor:
    """The additive attention mask ``[B, H, num_queries, K]`` of queries at absolute positions
    ``first_query..`` over keys ``0..K-1`` with a bias per key ``[B, H, K]``: the key's bias
    where the key is not after the query, -inf where it is."""
    keys = key_bias.shape[-1]
    rows = torch.arange(first_query, first_query + num_queries, device=key_bias.device)
    future = rows[:, None] < torch.arange(keys, device=key_bias.device)[None, :]
    return key_bias[..., None, :].masked_fill(future, float("-inf"))
