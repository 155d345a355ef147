"""What decoding carries between calls (the model's state, each layer's) and the functions
that walk a state's tensors."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch


class Decoding(NamedTuple):
    """What decoding runs (:meth:`CausalLM.decoding`): ``prefill(input_ids, max_new_tokens=0)
    -> (logits, state)`` and ``step(token_ids, state) -> (logits, state)``."""

    prefill: Callable[..., tuple[torch.Tensor, DecodingState]]
    step: Callable[[torch.Tensor, DecodingState], tuple[torch.Tensor, DecodingState]]


class LayerState(NamedTuple):
    """One layer's decoding state: its mixer's, and its MLP's (``None`` for a plain MLP)."""

    mixer: Any
    mlp: Any


@dataclasses.dataclass
class DecodingState:
    """What decoding carries between calls: the number of tokens seen and each layer's state;
    for a padded batch whose rows are at different positions of their own texts, ``positions``
    ``[B]`` (each row's next position; ``position`` counts the entries every row holds).

    MCSD layers hold fixed-size fp32 section states; attention layers hold a KV cache. Both
    are advanced in place (so a state must not be reused after it has been advanced:
    ``copy.deepcopy`` one that is to be continued twice). Every tensor of a layer's state has
    the batch as its first dimension (streams x batch, stream-major, where an architecture
    runs several streams), so that beam search can reorder the rows of any state.
    """

    position: int
    layers: list[LayerState | None]
    positions: torch.Tensor | None = None


@runtime_checkable
class CapacityState(Protocol):
    """A part of a layer's state that keeps an entry per position up to a ``capacity`` along its
    third axis (a KV cache): what :class:`mcsd.models.cuda_graphs.StaticStep` allocates at a
    fixed size and views a prefix of."""

    @property
    def capacity(self) -> int: ...

    def with_capacity(self, capacity: int) -> CapacityState:
        """A new zero-filled state of the same rows, heads and dtype with room for ``capacity`` positions."""
        ...

    def prefix(self, capacity: int) -> CapacityState:
        """A view of the first ``capacity`` positions (writes to it land in this state)."""
        ...

    def copy_positions_(self, other: CapacityState, count: int) -> None:
        """Copy ``other``'s first ``count`` positions into this state's."""
        ...

    def zero_positions_from_(self, start: int) -> None:
        """Zero every position from ``start`` on."""
        ...


def map_tensors(value: Any, function: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` (a layer state: tensors in tuples, named tuples, lists and dataclasses) with
    ``function`` applied to each tensor."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return function(value)
    if isinstance(value, list):
        return [map_tensors(item, function) for item in value]
    if isinstance(value, tuple):
        items = [map_tensors(item, function) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(value, **{field.name: map_tensors(getattr(value, field.name), function)
                                            for field in dataclasses.fields(value) if field.init})
    raise TypeError(f"a decoding state holds a {type(value).__qualname__}: map_tensors knows tensors, tuples, "
                    "lists and dataclasses")


def tensors_of(value: Any) -> list[torch.Tensor]:
    """Every tensor of ``value`` (a layer state), in :func:`map_tensors`' order."""
    found: list[torch.Tensor] = []
    map_tensors(value, lambda tensor: found.append(tensor) or tensor)
    return found
