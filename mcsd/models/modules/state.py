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


def map_state(value: Any, function: Callable[[Any], Any], parts: bool = False) -> Any:
    """``value`` (a decoding state or a piece of one: tensors in tuples, named tuples, lists and
    dataclasses; numbers such as a position pass through) with ``function`` applied to each of its
    leaves: each tensor, or with ``parts`` each part (a tensor, or a :class:`CapacityState` whole:
    a KV cache). The one walker of a state: the static step, the ONNX export, the bench's bytes and
    the Hugging Face cache all go through it."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor) or (parts and isinstance(value, CapacityState)):
        return function(value)
    if isinstance(value, list):
        return [map_state(item, function, parts) for item in value]
    if isinstance(value, tuple):
        items = [map_state(item, function, parts) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(value, **{field.name: map_state(getattr(value, field.name), function, parts)
                                            for field in dataclasses.fields(value) if field.init})
    raise TypeError(f"a decoding state holds a {type(value).__qualname__}: its walker knows tensors, tuples, "
                    "lists and dataclasses")


def map_tensors(value: Any, function: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` (a layer state) with ``function`` applied to each tensor (:func:`map_state`)."""
    return map_state(value, function)


def tensors_of(value: Any) -> list[torch.Tensor]:
    """Every tensor of ``value`` (a layer state), in :func:`map_state`'s order."""
    found: list[torch.Tensor] = []
    map_state(value, lambda tensor: found.append(tensor) or tensor)
    return found


def map_parts(value: Any, function: Callable[[Any], Any]) -> Any:
    """``value`` with ``function`` applied to each part: each KV cache (a :class:`CapacityState`)
    whole, each other tensor (:func:`map_state`)."""
    return map_state(value, function, parts=True)


def parts_of(value: Any) -> list[Any]:
    """Every part of ``value`` (a KV cache whole, or a tensor), in :func:`map_state`'s order: the
    tensors of the parts one after another are :func:`tensors_of`'s."""
    found: list[Any] = []
    map_state(value, lambda part: found.append(part) or part, parts=True)
    return found
