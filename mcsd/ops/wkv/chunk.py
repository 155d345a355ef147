"""Chunkwise form of RWKV-4's WKV: the parallel form inside chunks of ``chunk_size`` tokens,
every chunk at once, each started from the state ``(a, b, p)`` carried into it (one extra
logit ``p - tau w``). Memory ``O(N C D)`` instead of the parallel form's ``O(N^2 D)``.

The carried states are computed for all chunks at once, with no Python loop: each chunk's own
state at its end (from no state), then the states at every chunk's start as sums of those
under the decay ``e^{-C w}`` per chunk, in log-space with the max trick as everywhere in the
WKV. The sums are pairwise (a logit per pair of chunks, ``p_j - (i - 1 - j) C w``: distances
stay small numbers, where a cumulative sum in log-space would subtract two large ones), in two
levels so that memory stays ``O(nc * G * D)``: within groups of ``G`` chunks, then across groups;
at most ``G`` chunks in one level (no empty chunks: at 8 chunks 16x less work than a group of 32;
compiled, the choice is a guard on the length: one graph up to ``G`` chunks, one beyond).

The sequence is padded at the end to a multiple of the chunk with tokens of weight zero
(``k = -1e38``, ``v = 0``), which no real token reads; the final state is the last chunk's
start carried through its real tokens only.

Documents apart (``starts``): a chunk's own state keeps the tokens of the document open at its
end; chunk ``c'`` reaches chunk ``c``'s start only if no document starts between them (and the
initial state only chunks before the first start), in the same two levels (a group's carry
reaches a chunk only if no document starts in the group before it); inside a chunk a token
reads its own document's tokens, and the carried state only before the chunk's first start. A
masked logit is ``-1e38``: weight 0. Compiled, that intra-chunk part runs under a checkpoint, so
that its weights ``[chunks, C, C, D]`` are recomputed in the backward as the joined form's are:
its masks come from the position_ids every layer of the graph shares, and inductor's partitioner
otherwise keeps what a later layer derives from a value used far apart (at ``size=base`` and
16,384 tokens, one more such tensor per layer: 19% more peak memory than joined).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from mcsd.ops.common import document_index, state_dtype
from mcsd.ops.wkv.parallel import EMPTY_LOG_SCALE, empty_wkv_state, wkv_outputs

GROUP_CHUNKS = 32  # chunks per group of the two-level carry


def prefix_states(
    items: torch.Tensor, step_log_decay: torch.Tensor, initial_state: torch.Tensor,
    ends: torch.Tensor | None = None, first: torch.Tensor | None = None,
) -> torch.Tensor:
    """The states before each item and after the last: ``items`` ``[B, n, 3, D]`` (each an
    ``(a, b, p)`` state, as seen one step after it), ``step_log_decay`` ``[D]`` (the log-decay
    per item, negative), ``initial_state`` ``[B, 3, D]`` -> ``[B, n + 1, 3, D]``: row ``r`` is
    the initial state decayed by ``r`` steps with the items before ``r`` decayed by ``r - 1 - j``.
    Documents apart: ``ends`` ``[B, n]``, the document open at each item's end, and ``first``
    ``[B]``, the initial state's: row ``r`` takes item ``j`` only if no document starts after
    it and before ``r`` (the document open at ``r`` is ``j``'s), and the initial state only if
    none starts before ``r``."""
    count = items.shape[1]
    rows = torch.arange(count + 1, device=items.device)
    distance = (rows[:, None] - 1 - rows[None, :count]).to(items.dtype)  # r - 1 - j
    item_logits = (items[:, None, :, 2] + distance[..., None] * step_log_decay)  # [B, n + 1, n, D]
    item_logits = item_logits.masked_fill((distance < 0)[..., None], float("-inf"))
    initial_logits = initial_state[:, None, 2] + rows.to(items.dtype)[:, None] * step_log_decay  # [B, n + 1, D]
    if ends is not None:
        before = torch.cat([first[:, None], ends], dim=1)  # the document open at each row
        item_logits = item_logits.masked_fill((ends[:, None, :] != before[:, :, None])[..., None], EMPTY_LOG_SCALE)
        initial_logits = initial_logits.masked_fill((before != first[:, None])[..., None], EMPTY_LOG_SCALE)
    scale = torch.maximum(item_logits.amax(dim=2), initial_logits).detach()
    item_weights = torch.exp(item_logits - scale[:, :, None])
    initial_weights = torch.exp(initial_logits - scale)
    a = (item_weights * items[:, None, :, 0]).sum(2) + initial_weights * initial_state[:, None, 0]
    b = (item_weights * items[:, None, :, 1]).sum(2) + initial_weights * initial_state[:, None, 1]
    return torch.stack([a, b, scale], dim=2)


def merge_states(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """The sum of two ``(a, b, p)`` states ``[..., 3, D]`` taken at the same position."""
    scale = torch.maximum(first[..., 2, :], second[..., 2, :]).detach()
    first_weight, second_weight = torch.exp(first[..., 2, :] - scale), torch.exp(second[..., 2, :] - scale)
    a = first_weight * first[..., 0, :] + second_weight * second[..., 0, :]
    b = first_weight * first[..., 1, :] + second_weight * second[..., 1, :]
    return torch.stack([a, b, scale], dim=-2)


def decayed(state: torch.Tensor, log_decay: torch.Tensor) -> torch.Tensor:
    """An ``(a, b, p)`` state ``[..., 3, D]`` after a total log-decay ``log_decay`` (broadcast to
    ``[..., D]``): its scale ``p`` moves, ``a`` and ``b`` do not."""
    return torch.cat([state[..., :2, :], (state[..., 2, :] + log_decay).unsqueeze(-2)], dim=-2)


def carried_states(
    items: torch.Tensor, step_log_decay: torch.Tensor, initial_state: torch.Tensor, ends: torch.Tensor | None = None,
) -> torch.Tensor:
    """The states before each item (rows ``0 .. n - 1`` of :func:`prefix_states`) in two levels:
    within groups of :data:`GROUP_CHUNKS` items (the last group filled with empty items after
    the real ones), then across groups (each item's prefix in its group merged with the state
    carried into the group); at most :data:`GROUP_CHUNKS` items in one level. Documents apart
    (``ends`` ``[B, n]``, the document open at each item's end; the initial state's is 0): each
    level keeps only what no document start separates from the row, and the state carried into
    a group reaches an item only if no document starts in the group before it."""
    batch, count, _, channels = items.shape
    first = None if ends is None else ends.new_zeros(batch)
    if count <= GROUP_CHUNKS:
        return prefix_states(items, step_log_decay, initial_state, ends, first)[:, :count]
    groups = -(-count // GROUP_CHUNKS)
    filler = groups * GROUP_CHUNKS - count
    empty = empty_wkv_state(batch * filler, channels, items.device, items.dtype).view(batch, filler, 3, channels)
    items = torch.cat([items, empty], dim=1)
    group_ends = group_firsts = before = None
    if ends is not None:
        ends = torch.cat([ends, ends[:, -1:].expand(-1, filler)], dim=1).view(batch, groups, GROUP_CHUNKS)
        before = torch.cat([first[:, None], ends.flatten(1)[:, :-1]], dim=1).view(batch, groups, GROUP_CHUNKS)
        group_ends, group_firsts = ends[:, :, -1], before[:, :, 0]
    within = prefix_states(items.view(batch * groups, GROUP_CHUNKS, 3, channels), step_log_decay,
                           empty_wkv_state(batch * groups, channels, items.device, items.dtype),
                           None if ends is None else ends.flatten(0, 1), None if ends is None else group_firsts.flatten())
    within = within.view(batch, groups, GROUP_CHUNKS + 1, 3, channels)
    group_starts = prefix_states(within[:, :, GROUP_CHUNKS], GROUP_CHUNKS * step_log_decay,
                                 initial_state, group_ends, first)[:, :groups]  # the state entering each group
    steps = torch.arange(GROUP_CHUNKS, device=items.device, dtype=items.dtype)
    entering = decayed(group_starts[:, :, None].expand(-1, -1, GROUP_CHUNKS, -1, -1),
                       steps[:, None] * step_log_decay)  # [B, groups, G, 3, D]
    if ends is not None:
        reached = (before == group_firsts[:, :, None])[..., None, None]
        entering = torch.where(reached, entering, empty_wkv_state(1, channels, items.device, items.dtype))
    starts = merge_states(entering, within[:, :, :GROUP_CHUNKS])
    return starts.view(batch, groups * GROUP_CHUNKS, 3, channels)[:, :count]


def own_states(k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, end: int) -> torch.Tensor:
    """The state of each run of tokens ``k``, ``v`` ``[B, n, C, D]`` from no state, as token
    ``end`` of the run reads it (logits ``k_i - (end - 1 - i) w``; tokens from ``end`` on must be
    filler, of weight zero): ``[B, n, 3, D]``."""
    distance = end - 1 - torch.arange(k.shape[2], device=k.device, dtype=w.dtype)
    logits = k - distance[:, None] * w
    scale = logits.amax(dim=2).detach()
    weights = torch.exp(logits - scale[:, :, None])
    return torch.stack([(weights * v).sum(2), weights.sum(2), scale], dim=2)


def chunk_wkv(
    w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    initial_state: torch.Tensor | None = None, chunk_size: int = 64, starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`parallel_wkv`."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size}: give a positive number of tokens per chunk")
    dtype = state_dtype(v)
    batch, length, channels = k.shape
    state = empty_wkv_state(batch, channels, k.device, dtype) if initial_state is None else initial_state.to(dtype)
    chunks = -(-length // chunk_size)  # compiled, multiples of the chunk take a graph of their own
    filler = chunks * chunk_size - length
    w32 = w.to(dtype)
    k_chunks = F.pad(k.to(dtype), (0, 0, 0, filler), value=EMPTY_LOG_SCALE).view(batch, chunks, chunk_size, channels)
    v_chunks = F.pad(v.to(dtype), (0, 0, 0, filler)).view(batch, chunks, chunk_size, channels)

    if starts is None:
        chunk_starts = carried_states(own_states(k_chunks, v_chunks, w32, chunk_size), -chunk_size * w32, state)
        same = carried_visible = None
        k_own = k_chunks
    else:
        index = document_index(starts, chunks * chunk_size).view(batch, chunks, chunk_size)
        ends = index[:, :, -1]  # the document open at each chunk's end (the filler's: the last)
        before = F.pad(ends, (1, 0))  # ... at each chunk's start, and after the last chunk
        k_own = k_chunks.masked_fill((index != ends[:, :, None])[..., None], EMPTY_LOG_SCALE)
        chunk_starts = carried_states(own_states(k_own, v_chunks, w32, chunk_size), -chunk_size * w32, state, ends)
        same = (index[..., :, None] == index[..., None, :]).view(batch * chunks, chunk_size, chunk_size)
        carried_visible = (index == before[:, :chunks, None]).view(batch * chunks, chunk_size)
    intra_chunk = (w32, u.to(dtype), k_chunks.view(batch * chunks, chunk_size, channels),
                   v_chunks.view(batch * chunks, chunk_size, channels),
                   chunk_starts.reshape(batch * chunks, 3, channels), same, carried_visible)
    if same is not None and torch.compiler.is_compiling():  # recomputed in the backward (module docstring)
        output = checkpoint(wkv_outputs, *intra_chunk, use_reentrant=False)
    else:
        output = wkv_outputs(*intra_chunk)
    # The final state: the last chunk's start carried through its real tokens only (the filler
    # after them would decay it, and undoing that in log-space costs digits); with documents
    # apart, the last document's tokens, and the start only if that document was open there.
    last = chunk_size - filler
    tail = own_states(k_own[:, -1:], v_chunks[:, -1:], w32, last)[:, 0]
    carried = decayed(chunk_starts[:, -1], -last * w32)
    if starts is not None:
        carried = torch.where((before[:, chunks - 1] == ends[:, -1])[:, None, None], carried,
                              empty_wkv_state(batch, channels, k.device, dtype))
    final = merge_states(carried, tail)
    return output.view(batch, chunks * chunk_size, channels)[:, :length].to(v.dtype), final
