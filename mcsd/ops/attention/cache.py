"""The attention op's decoding state, a KV cache, and what each kind of cache does with a token:
write it and attend over what it holds. Each decoding runtime is a cache type with its own
:meth:`~KVCache.step`; the mixer (:class:`mcsd.models.modules.attention.CausalSelfAttention`)
only projects and rotates.

- :class:`KVCache`: preallocated keys and values (and a per-key bias), written in place; a
  sequence is written then attended in blocks (:meth:`KVCache.attend`, every cache's), and a
  token per row at an ``int`` position grows it geometrically (amortised O(1) copies per token);
- :class:`StaticKVCache`: the step at fixed addresses that CUDA graphs replay
  (:mod:`mcsd.models.cuda_graphs`): at a 0-d tensor position it keeps its size and attends over
  its whole capacity masked past the position;
- :class:`PaddedKVCache`: a padded batch's (``starts`` ``[B]``), each row at its own position
  (``[B]``) attending from its own start;
- :class:`ReadOnlyKVCache`: read and not written (an ONNX export's step): the token's entries
  are returned for the caller to write.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from mcsd.ops.attention.causal import biased_mask, causal_attention


@dataclasses.dataclass
class KVCache:
    """One layer's preallocated keys and values, ``[B, H, capacity, Dh]`` each, and, for an
    attention with a per-key score bias (the Wonderful Matrices' dynamic mask), that bias
    ``[B, H, capacity]``."""

    keys: torch.Tensor
    values: torch.Tensor
    key_bias: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def _with_fields(self, fields: list[torch.Tensor | None]) -> KVCache:
        """This cache's type and settings over other per-position tensors (keys, values, key bias)."""
        return dataclasses.replace(self, **dict(zip(("keys", "values", "key_bias"), fields)))

    def with_capacity(self, capacity: int) -> KVCache:
        """A zero-filled cache of the same type, rows, heads and dtype with room for ``capacity`` positions."""
        return self._with_fields([None if old is None else old.new_zeros(*old.shape[:2], capacity, *old.shape[3:])
                                  for old in self._fields()])

    def prefix(self, capacity: int) -> KVCache:
        """A view of the first ``capacity`` positions: writes to it land in this cache."""
        return self._with_fields([None if old is None else old[:, :, :capacity] for old in self._fields()])

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
        """The tensors with an entry per position."""
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

    def last_document(self, length: int | torch.Tensor) -> KVCache:
        """The cache of a packed run's last ``length`` positions (its last document's) at positions
        ``0..length-1``: what decoding that document on reads. Lengths ``[B]`` (a padded batch,
        each row's own): a :class:`PaddedKVCache` of every position, each row's attended from its
        own start on."""
        if isinstance(length, torch.Tensor):
            return PaddedKVCache(self.keys, self.values, self.key_bias, starts=self.keys.shape[2] - length)
        return KVCache(*(None if part is None else part[:, :, -length:].clone() for part in self._fields()))

    def attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
        position: int, block: int | None,
    ) -> torch.Tensor:
        """Write a sequence's keys and values (and key biases) ``[B, H, N, ...]`` at ``position..``,
        then attend its query blocks of ``block`` tokens (all at once if None) to everything
        before them; ``[B, H, N, Dh]``."""
        length = query.shape[2]
        end = position + length
        self.reserve(end, filled=position)
        self.keys[:, :, position:end] = key.to(self.keys.dtype)
        self.values[:, :, position:end] = value.to(self.values.dtype)
        if bias is not None:
            self.key_bias[:, :, position:end] = bias.to(self.key_bias.dtype)
        if block is None:
            keys, values = self.keys[:, :, :end].to(query.dtype), self.values[:, :, :end].to(query.dtype)
            if position == 0:  # from the sequence's start: the fused causal kernel, no [N, N] mask
                return causal_attention(query, keys, values, None if bias is None else self.key_bias[:, :, :end])
            if bias is not None:
                mask = biased_mask(self.key_bias[:, :, :end].to(query.dtype), position, length)
            else:  # query i (absolute position + i) sees keys <= itself
                mask = torch.arange(position, end, device=query.device)[:, None] >= torch.arange(
                    end, device=query.device)[None, :]
            return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask)
        outputs = []
        for start in range(0, length, block):
            stop = min(start + block, length)
            visible = position + stop
            keys = self.keys[:, :, :visible].to(query.dtype)
            values = self.values[:, :, :visible].to(query.dtype)
            if bias is not None:
                mask = biased_mask(self.key_bias[:, :, :visible].to(query.dtype), position + start, stop - start)
            elif stop - start > 1:  # query i (absolute position + start + i) sees keys <= itself
                rows = torch.arange(position + start, visible, device=query.device)
                mask = rows[:, None] >= torch.arange(visible, device=query.device)[None, :]
            else:
                mask = None
            outputs.append(F.scaled_dot_product_attention(query[:, :, start:stop], keys, values, attn_mask=mask))
        return torch.cat(outputs, dim=2)

    def step(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
        position: int,
    ) -> tuple[torch.Tensor, KVCache]:
        """One token per row (``query``, ``key``, ``value`` ``[B, H, Dh]``, ``bias`` ``[B, H, 1]``)
        at the ``int`` ``position``: its entries written into the cache in place (grown as
        needed), its query attending to every cached position (none is in its future);
        ``([B, H, 1, Dh], the cache)``."""
        if isinstance(position, torch.Tensor):
            raise TypeError("a KVCache steps at an int position: a 0-d tensor position is the step at fixed "
                            "addresses (StaticKVCache.of(cache)), [B] positions a padded batch's (PaddedKVCache)")
        end = position + 1
        self.reserve(end, filled=position)
        # Slices, not integer indices: a compiled step keeps ``position`` symbolic through them.
        self.keys[:, :, position:end] = key[:, :, None].to(self.keys.dtype)
        self.values[:, :, position:end] = value[:, :, None].to(self.values.dtype)
        mask = None
        if bias is not None:
            self.key_bias[:, :, position:end] = bias.to(self.key_bias.dtype)
            mask = self.key_bias[:, :, None, :end].to(query.dtype)
        attended = F.scaled_dot_product_attention(query[:, :, None], self.keys[:, :, :end].to(query.dtype),
                                                  self.values[:, :, :end].to(query.dtype), attn_mask=mask)
        return attended, self


@dataclasses.dataclass
class PaddedKVCache(KVCache):
    """A padded batch's KV cache: ``starts`` ``[B]`` says where each row's own tokens start (the
    positions before, its padding or the earlier documents of a packed prompt, are never
    attended to); each row steps at its own position."""

    starts: torch.Tensor | None = None

    def step(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
        position: torch.Tensor,
    ) -> tuple[torch.Tensor, KVCache]:
        """One query per row ``[B, H, Dh]`` of a padded batch, row b at its own ``position[b]``
        (its rotary angle): the token written at the cache's next index (``starts + position``,
        the same for every row), attending to the row's own keys from ``starts`` on;
        ``([B, H, 1, Dh], the cache)``."""
        index = int(self.starts[0] + position[0])
        end = index + 1
        self.reserve(end, filled=index)
        self.keys[:, :, index:end] = key[:, :, None].to(self.keys.dtype)
        self.values[:, :, index:end] = value[:, :, None].to(self.values.dtype)
        own = torch.arange(end, device=query.device)[None, :] >= self.starts[:, None]  # [B, end]
        mask = own[:, None, None, :]
        if bias is not None:
            self.key_bias[:, :, index:end] = bias.to(self.key_bias.dtype)
            mask = self.key_bias[:, :, None, :end].to(query.dtype).masked_fill(~mask, float("-inf"))
        attended = F.scaled_dot_product_attention(query[:, :, None], self.keys[:, :, :end].to(query.dtype),
                                                  self.values[:, :, :end].to(query.dtype), attn_mask=mask)
        return attended, self


@dataclasses.dataclass
class StaticKVCache(KVCache):
    """A KV cache at fixed addresses (what :class:`~mcsd.models.cuda_graphs.StaticStep`'s buffers
    hold): a step writes at a 0-d tensor position and attends over the whole capacity, so that
    no shape or Python branch depends on the position and a CUDA graph replays it anywhere. At
    an ``int`` position it steps as an eager cache (a state the static step returned, decoded on
    by :meth:`CausalLM.step`)."""

    @classmethod
    def of(cls, cache: KVCache) -> StaticKVCache:
        """``cache``'s tensors (not copied) as a cache at fixed addresses."""
        return cls(cache.keys, cache.values, cache.key_bias)

    def step(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
        position: torch.Tensor,
    ) -> tuple[torch.Tensor, KVCache]:
        """One query per row ``[B, H, Dh]`` at the 0-d tensor ``position``: its key and value (and
        key bias) written at ``position``, attending over the cache's whole capacity with the
        positions after it masked (an entry never written must hold finite numbers:
        :class:`~mcsd.models.cuda_graphs.StaticStep` allocates zeros); ``([B, H, 1, Dh], the cache)``."""
        if not isinstance(position, torch.Tensor):
            return super().step(query, key, value, bias, position)
        index = position.reshape(1)
        self.keys.index_copy_(2, index, key[:, :, None].to(self.keys.dtype))
        self.values.index_copy_(2, index, value[:, :, None].to(self.values.dtype))
        visible = (torch.arange(self.capacity, device=query.device) <= position)[None]  # [1, capacity]
        if bias is None:
            mask = visible
        else:
            self.key_bias.index_copy_(2, index, bias.to(self.key_bias.dtype))
            mask = self.key_bias[:, :, None, :].to(query.dtype).masked_fill(~visible, float("-inf"))
        attended = F.scaled_dot_product_attention(query[:, :, None], self.keys.to(query.dtype),
                                                  self.values.to(query.dtype), attn_mask=mask)
        return attended, self


@dataclasses.dataclass
class ReadOnlyKVCache(StaticKVCache):
    """A KV cache that a step at a 0-d tensor position reads and does not write: what an ONNX
    export's step is given (:mod:`mcsd.deploy.onnx`). The step attends over the positions before
    its own (the rest masked) and to its own key and value beside them, and returns its token's
    entries (a :class:`KVCache` of one position) for the caller to write at the position: in a
    graph a write into an input copies the whole cache at every step, where the runner writes the
    one position in place."""

    def step(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
        position: torch.Tensor,
    ) -> tuple[torch.Tensor, KVCache]:
        """One query per row ``[B, H, Dh]`` at the 0-d tensor ``position`` attending over the
        positions before it (the rest masked, never written to) and its own entries beside them,
        in one softmax: :meth:`StaticKVCache.step`'s numbers without writing the cache;
        ``([B, H, 1, Dh], the token's entries)``."""
        entries = KVCache(key[:, :, None].to(self.keys.dtype), value[:, :, None].to(self.values.dtype),
                          None if bias is None else bias.to(self.key_bias.dtype))
        scale = query.shape[-1] ** -0.5
        query = query[:, :, None]
        past = query @ self.keys.to(query.dtype).transpose(-1, -2) * scale  # [B, H, 1, capacity]
        own = query @ entries.keys.to(query.dtype).transpose(-1, -2) * scale  # [B, H, 1, 1]
        if self.key_bias is not None:
            past = past + self.key_bias[:, :, None, :].to(query.dtype)
            own = own + entries.key_bias[:, :, None, :].to(query.dtype)
        before = (torch.arange(self.capacity, device=query.device) < position)[None, None, None]
        scores = torch.cat([past.masked_fill(~before, float("-inf")), own], -1)
        weights = torch.softmax(scores, -1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(query.dtype)
        attended = (weights[..., :-1] @ self.values.to(query.dtype)
                    + weights[..., -1:] * entries.values.to(query.dtype))
        return attended, entries
