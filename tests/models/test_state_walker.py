"""The one walker of a decoding state (mcsd/models/modules/state.py): tensors one by one, or parts
(a KV cache whole, each other tensor), in one order, for every architecture's state."""

from __future__ import annotations

import pytest
import torch
from helpers.models import TINY, tiny_model_to_compile

from mcsd.bench.decoding import state_bytes
from mcsd.models import registry
from mcsd.models.modules.state import CapacityState, map_parts, parts_of, tensors_of
from mcsd.ops.attention import KVCache


@pytest.mark.parametrize("name", registry.architectures())
@torch.no_grad()
def test_parts_are_the_tensors_with_each_kv_cache_whole(name: str) -> None:
    model = tiny_model_to_compile(name)
    _, state = model.prefill(torch.randint(0, TINY["vocab_size"], (2, 7)), max_new_tokens=3)
    parts = parts_of(state)
    assert [tensor for part in parts for tensor in tensors_of(part)] == tensors_of(state)
    caches = [part for part in parts if isinstance(part, CapacityState)]
    assert all(isinstance(part, (torch.Tensor, KVCache)) for part in parts)
    assert bool(caches) == ("attention" in model.architecture.ops)
    rebuilt = map_parts(state, lambda part: part)
    assert rebuilt.position == state.position and tensors_of(rebuilt) == tensors_of(state)
    counted = sum(tensor.numel() * tensor.element_size() for tensor in tensors_of(state))
    assert state_bytes(state) == counted
    read = state_bytes(state, kv_positions=5)
    cache_bytes = sum(tensor.numel() * tensor.element_size() for cache in caches for tensor in tensors_of(cache))
    assert read == pytest.approx(counted - cache_bytes + sum(
        sum(t.numel() * t.element_size() for t in tensors_of(cache)) * 5 / cache.capacity for cache in caches))
    if caches:
        assert read < counted  # a capacity of 10, 5 positions read
