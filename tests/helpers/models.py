"""Tiny models of every registered architecture and variant, decoding them, and the spec's
measure of agreement between two outputs."""

from __future__ import annotations

from typing import Any

import torch
import yaml

from mcsd.models import CausalLM, DecodingState, registry
from mcsd.models.build import build_model
from mcsd.models.config import class_path


TINY = dict(vocab_size=101, hidden_size=24, num_channels=3, num_layers=2, mlp_hidden_size=40)


def relative_rms_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """RMS of the difference over RMS of the expected value (the spec's agreement measure)."""
    expected = expected.double()
    return ((actual.double() - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt()).item()


def variant_cases() -> list[str]:
    """``arch/variant`` for every registered architecture and each of its variants, then
    ``arch/default_variant+key=value`` for each of its setting cases."""
    cases = []
    for name in registry.architectures():
        architecture = registry.get(name)
        cases += [f"{name}/{variant}" for variant in architecture.variants]
        default = next(iter(architecture.variants))
        cases += [f"{name}/{default}+" + "+".join(f"{key}={value}" for key, value in setting.items())
                  for setting in architecture.setting_cases]
    return cases


def tiny_config(case: str, **fields: Any) -> dict[str, Any]:
    """A tiny model node for ``arch``, ``arch/variant`` (the default variant if none) or
    ``arch/variant+key=value+...`` (settings on top)."""
    name, _, variant = case.partition("/")
    variant, *settings = variant.split("+")
    architecture = registry.get(name)
    overrides = architecture.variants[variant or next(iter(architecture.variants))]
    extra = {key: yaml.safe_load(value) for key, value in (setting.split("=", 1) for setting in settings)}
    return {"_target_": class_path(architecture.config_class), **TINY, "chunk_size": 16, **overrides, **extra, **fields}


def tiny_model(case: str, **fields: Any) -> CausalLM:
    return build_model(tiny_config(case, **fields)).eval()


def decode_all(model: CausalLM, input_ids: torch.Tensor, split: int, hint: bool = True,
               compile: bool = False) -> torch.Tensor:
    """Prefill ``input_ids[:, :split]`` then step through the rest (with the compiled step with
    ``compile``); logits of positions split-1.. With ``hint=False`` the prefill is not told how
    many tokens follow."""
    return decode_with_state(model, input_ids, split, hint, compile)[0]


def decode_with_state(model: CausalLM, input_ids: torch.Tensor, split: int, hint: bool = True,
                      compile: bool = False) -> tuple[torch.Tensor, DecodingState]:
    """:func:`decode_all`, and the decoding state after the last token."""
    length = input_ids.shape[1]
    step = model.step_function(compile)
    logits, state = model.prefill(input_ids[:, :split], max_new_tokens=length - split if hint else 0)
    outputs = [logits]
    for position in range(split, length):
        logits, state = step(input_ids[:, position].clone(), state)
        outputs.append(logits)
    return torch.stack(outputs, dim=1), state


SIXTEEN_BIT_TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 4e-3}
"""How far a model cast to 16 bits may be from its fp32 self: the relative RMS error of its logits
along a fixed token path (not its greedy tokens, which may part at near-ties). The tiny models
here stay within a quarter of it (bf16 at most 8e-3, fp16 1e-3)."""


def floating_tensors(state: object) -> list[torch.Tensor]:
    """The floating-point tensors of a (layer's) decoding state, however it nests them."""
    if isinstance(state, torch.Tensor):
        return [state] if state.is_floating_point() else []
    if isinstance(state, (list, tuple)):
        return [tensor for item in state for tensor in floating_tensors(item)]
    if hasattr(state, "__dict__"):  # a dataclass (a KV cache) or another object of tensors
        return floating_tensors(list(vars(state).values()))
    return []


def assert_recurrent_states_stay_fp32(model: CausalLM, state: DecodingState) -> None:
    """Every floating tensor of every recurrent state is fp32; a KV cache (a state that keeps an
    entry per position, :attr:`TokenMixer.state_rewinds`) follows the model's dtype."""
    for layer, layer_state in zip(model.layers, state.layers):
        for part, part_state in ((layer.mixer, layer_state.mixer), (layer.mlp, layer_state.mlp)):
            if not getattr(part, "state_rewinds", True):
                assert {tensor.dtype for tensor in floating_tensors(part_state)} == {torch.float32}, type(part)


# Compiling takes time per layer: one layer of each of an architecture's kinds (the hybrid's
# SSD layer and its attention layer, every 2nd; one layer for the others).
ONE_LAYER_OF_EACH_KIND = {"wonderful_matrices": {"num_layers": 2, "attention_every": 2}}


def tiny_model_to_compile(name: str) -> CausalLM:
    """The tiny model of ``name`` with one layer of each kind it has."""
    return tiny_model(name, **ONE_LAYER_OF_EACH_KIND.get(name, {"num_layers": 1}))
