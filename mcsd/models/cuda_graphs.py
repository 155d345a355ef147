"""Decoding at fixed addresses, recorded once and replayed as CUDA graphs.

A decoding step of a 1.6B model launches hundreds of small kernels; launched one by one from
Python, the GPU waits on the launches. A CUDA graph records them once and replays them in one
launch, on the same memory each time. So the step it records (:meth:`CausalLM.static_step`)
takes its position from device memory, not as a Python int, and keeps every state at a fixed
address: recurrent states are written in place, and a KV cache is allocated with room for a
capacity, written at the position and read whole, the positions after it masked (a
:class:`~mcsd.ops.attention.StaticKVCache`, whose own step that is).

:class:`StaticStep` keeps, per batch size, the buffers of one sequence's state (KV caches
allocated at a *capacity bucket*: a power of two of at least ``min_capacity``), of the input
token and of the position, and one recording per bucket that the sequence has reached: a step
at position ``p`` runs the recording for the smallest bucket holding ``p + 1`` positions, which
attends over that prefix of the cache. A sequence that outgrows the allocation gets buffers
twice as large (its positions copied over) and its recordings are made again. A model without
KV caches has one recording per batch size. Recording warms the step up first (two steps on
the state's own buffers, the recurrent states put back after them), which also compiles it
with ``compile``.

``record="cuda"`` records CUDA graphs; ``record="call"`` is the same path on any device with
each replay a call of the step: what the CPU tests run.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch

from mcsd.models.modules.compiled import compiled_method
from mcsd.models.modules.state import CapacityState, DecodingState, LayerState, map_parts, parts_of
from mcsd.ops.attention import StaticKVCache

if TYPE_CHECKING:
    from mcsd.models.modeling import CausalLM

DEFAULT_MIN_CAPACITY = 256
WARMUP_STEPS = 2  # before a recording: lazy initialisation (cuBLAS, compilation) out of the graph

_COMPILED_STATIC_STEPS: weakref.WeakKeyDictionary[CausalLM, Callable] = weakref.WeakKeyDictionary()


def capacity_bucket(positions: int, min_capacity: int) -> int:
    """The smallest power of two of at least ``min_capacity`` that holds ``positions`` positions."""
    return max(min_capacity, 1 << max(positions - 1, 0).bit_length())


class _Recording(NamedTuple):
    """One recorded step: ``replay()`` runs it again on the same buffers; ``logits`` its output."""

    replay: Callable[[], Any]
    logits: torch.Tensor


class _Buffers:
    """One batch size's fixed buffers: the state (KV caches with room for ``capacity`` positions),
    the token, the position, the state's prefix views and the recordings per bucket."""

    def __init__(self, state: DecodingState, capacity: int, device: torch.device) -> None:
        def allocate(part: Any) -> Any:
            if not isinstance(part, CapacityState):
                return part.clone(memory_format=torch.contiguous_format)
            if part.capacity == capacity:  # the state's own cache has the room: its tensors kept, no second copy
                part.zero_positions_from_(state.position)
                return StaticKVCache.of(part)
            fresh = StaticKVCache.of(part.with_capacity(capacity))
            fresh.copy_positions_(part, state.position)
            return fresh

        self.capacity = capacity
        self.layers = map_parts(state.layers, allocate)
        self.tokens: torch.Tensor | None = None
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.views: dict[int, list[Any]] = {}
        self.recordings: dict[int, _Recording] = {}

    def load(self, state: DecodingState) -> None:
        """Copy a state that is not these buffers' own (a new sequence) into them; a KV cache
        that is the buffers' own (read into by :meth:`StaticStep.prefill`) stays."""
        for mine, theirs in zip(parts_of(self.layers), parts_of(state.layers), strict=True):
            if mine is theirs:
                continue
            if isinstance(mine, CapacityState):
                mine.copy_positions_(theirs, state.position)
            else:
                mine.copy_(theirs)

    def prefill_layers(self) -> list[LayerState]:
        """A state to read a prompt into: each layer part that is a KV cache is the buffers' own,
        every other part starts afresh (``None``)."""
        def kept(part: Any) -> Any:
            return part if isinstance(part, CapacityState) else None

        return [LayerState(kept(layer.mixer), kept(layer.mlp)) for layer in self.layers]

    def view(self, bucket: int) -> list[Any]:
        """The state with each KV cache viewed at its first ``bucket`` positions (all of it at bucket 0)."""
        if bucket not in self.views:
            self.views[bucket] = map_parts(self.layers, lambda part: part.prefix(bucket)
                                          if bucket and isinstance(part, CapacityState) else part)
        return self.views[bucket]

    def recurrent_tensors(self) -> list[torch.Tensor]:
        """The state's tensors that a step advances, not only writes at its position (all but the
        KV caches): what a warm-up step must put back."""
        return [part for part in parts_of(self.layers) if isinstance(part, torch.Tensor)]


class StaticStep:
    """``step(token_ids, state) -> (logits, state)`` as :meth:`CausalLM.step`, run through
    recordings of :meth:`CausalLM.static_step` at fixed addresses (see the module's docstring).

    The state must come from :meth:`prefill` (or :meth:`CausalLM.prefill`: every layer's state
    made) or from this step; the state it returns holds the step's own buffers, advanced in place
    by the next call (as every decoding state is). The logits it returns are the caller's (a copy
    of the recording's output). A new sequence of a batch size seen before reuses the buffers and
    recordings: :meth:`prefill` reads its prompt into the buffers' KV caches (no second cache)."""

    def __init__(
        self, model: CausalLM, compile: bool = False, record: Literal["cuda", "call"] = "cuda",
        min_capacity: int = DEFAULT_MIN_CAPACITY,
    ) -> None:
        if record == "cuda" and model.embed.weight.device.type != "cuda":
            raise ValueError("record='cuda' needs a model on a CUDA device; record='call' runs the same path elsewhere")
        self.model, self.record, self.min_capacity = model, record, min_capacity
        self.run = compiled_method(_COMPILED_STATIC_STEPS, model, "static_step") if compile else model.static_step
        self.buffers: dict[int, _Buffers] = {}
        self.recorded = 0  # recordings made, over every batch size and bucket
        self.replayed = 0

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, max_new_tokens: int = 0) -> tuple[torch.Tensor, DecodingState]:
        """:meth:`CausalLM.prefill`, into the KV caches of this batch size's buffers when they
        have room for the prompt."""
        buffers = self.buffers.get(input_ids.shape[0])
        if buffers is None or (buffers.capacity and buffers.capacity < input_ids.shape[1]):
            return self.model.prefill(input_ids, max_new_tokens=max_new_tokens)
        return self.model.prefill(input_ids, DecodingState(position=0, layers=buffers.prefill_layers()))

    @torch.no_grad()
    def __call__(self, token_ids: torch.Tensor, state: DecodingState) -> tuple[torch.Tensor, DecodingState]:
        if any(layer_state is None for layer_state in state.layers):
            raise ValueError("a static step needs a state with every layer's state made: prefill the prompt first")
        rows, needed = token_ids.shape[0], state.position + 1
        caches = [part for part in parts_of(state.layers) if isinstance(part, CapacityState)]
        buffers = self.buffers.get(rows)
        if buffers is None or (caches and buffers.capacity < needed):
            # Room for what the state was given room for (prefill's max_new_tokens) at least: one
            # allocation for a whole sequence when it says how long that will be.
            capacity = max([capacity_bucket(needed, self.min_capacity), *(cache.capacity for cache in caches)])
            self.buffers[rows] = buffers = _Buffers(state, capacity if caches else 0, token_ids.device)
        elif state.layers is not buffers.layers:
            buffers.load(state)
        bucket = min(capacity_bucket(needed, self.min_capacity), buffers.capacity) if caches else 0
        if buffers.tokens is None:
            buffers.tokens = token_ids.clone()
        buffers.tokens.copy_(token_ids)
        buffers.position.fill_(state.position)
        recording = buffers.recordings.get(bucket)
        if recording is None:
            recording = buffers.recordings[bucket] = self._record(buffers, bucket)
        recording.replay()
        self.replayed += 1
        return recording.logits.clone(), DecodingState(position=needed, layers=buffers.layers)

    def _record(self, buffers: _Buffers, bucket: int) -> _Recording:
        """Warm the step up on ``buffers`` (putting their recurrent states back), then record it."""
        layers = buffers.view(bucket)

        def step() -> torch.Tensor:
            return self.run(buffers.tokens, layers, buffers.position)

        saved = [tensor.clone() for tensor in buffers.recurrent_tensors()]

        def put_back() -> None:
            for tensor, value in zip(buffers.recurrent_tensors(), saved):
                tensor.copy_(value)

        side = torch.cuda.Stream() if self.record == "cuda" else None
        try:  # whatever fails, the states are put back and no capture is left open: the next call records anew
            if side is not None:
                side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                for _ in range(WARMUP_STEPS):
                    logits = step()
                if side is not None:
                    torch.cuda.current_stream().wait_stream(side)
            put_back()
            if self.record == "call":
                output = torch.empty_like(logits)
                recording = _Recording(lambda: output.copy_(step()), output)
            else:
                graph = torch.cuda.CUDAGraph()
                recording = _Recording(graph.replay, capture(graph, step))
        except BaseException:
            put_back()
            raise
        self.recorded += 1
        return recording


def capture(graph: torch.cuda.CUDAGraph, step: Callable[[], torch.Tensor]) -> torch.Tensor:
    """Record ``step`` into ``graph`` on a side stream (as ``torch.cuda.graph`` does); an error
    inside ends the capture and drops it before it is raised (``torch.cuda.graph``'s exit would
    raise capture_end's own error instead, and leave the stream switched)."""
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin()
        try:
            output = step()
        except BaseException:
            with contextlib.suppress(Exception):  # an invalidated capture refuses to end cleanly
                graph.capture_end()
            graph.reset()
            raise
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    return output
