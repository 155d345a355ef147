"""A model's method through ``torch.compile``, compiled once per model and held weakly."""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def compiled_method(cache: weakref.WeakKeyDictionary, model: nn.Module, name: str, **options: Any) -> Callable:
    """``model.<name>`` through ``torch.compile``, kept in ``cache`` for as long as the model lives:
    the compiled function holds the model weakly (a bound method would keep it, and its entry,
    alive for ever).

    Each model compiles a function of its own, with its own code object: dynamo keeps its graphs
    per code object, so models sharing ``type(model).<name>`` would share one recompile budget
    (``torch._dynamo.config.recompile_limit``, 8), past which later models silently run eager."""
    if model not in cache:
        method = getattr(type(model), name)
        own = types.FunctionType(method.__code__.replace(), method.__globals__, method.__name__,
                                 method.__defaults__, method.__closure__)
        own.__kwdefaults__ = method.__kwdefaults__
        compiled = torch.compile(own, **options)
        model_ref = weakref.ref(model)

        def call(*args: Any, **kwargs: Any) -> Any:
            return compiled(model_ref(), *args, **kwargs)

        cache[model] = call
    return cache[model]
