"""Every model is one function in its parallel, chunkwise and recurrent/KV-cache forms."""

from __future__ import annotations

import pytest
import torch

from conftest import relative_rms_error
from mcsd import build_model

TOLERANCE = 1e-5
LENGTHS = [1, 2, 63, 64, 65, 301]
VARIANTS = {
    "full": {"sections": ["slope", "decay"]},
    "slope_only": {"sections": ["slope"]},
    "decay_only": {"sections": ["decay"]},
    "double_slope": {"sections": ["slope", "slope"]},
    "double_decay": {"sections": ["decay", "decay"]},
    "full_sum_fusion": {"sections": ["slope", "decay"], "fusion": "sum"},
}
MODELS = {f"mcsd-{name}": ("mcsd.models.config.MCSDConfig", extra) for name, extra in VARIANTS.items()}
MODELS["transformer"] = ("mcsd.models.config.TransformerConfig", {})


def tiny_model(name: str, chunk_size: int = 16) -> torch.nn.Module:
    target, extra = MODELS[name]
    config = dict(_target_=target, vocab_size=101, hidden_size=24, num_channels=3, num_layers=2,
                  mlp_hidden_size=40, chunk_size=chunk_size, **extra)
    return build_model(config).eval()


def decode_all(model: torch.nn.Module, input_ids: torch.Tensor, split: int) -> torch.Tensor:
    """Prefill ``input_ids[:, :split]`` then step through the rest; logits of positions split-1.."""
    length = input_ids.shape[1]
    logits, state = model.prefill(input_ids[:, :split], max_new_tokens=length - split)
    outputs = [logits]
    for position in range(split, length):
        logits, state = model.step(input_ids[:, position], state)
        outputs.append(logits)
    return torch.stack(outputs, dim=1)


@pytest.mark.parametrize("name", MODELS)
@torch.no_grad()
def test_parallel_chunk_and_recurrent_logits_agree(name: str) -> None:
    for chunk_size in (16, 64):
        model = tiny_model(name, chunk_size)
        for length in LENGTHS:
            input_ids = torch.randint(0, 101, (2, length))
            reference = model(input_ids, form="parallel")
            assert reference.shape == (2, length, 101)
            chunked = model(input_ids, form="chunk")
            assert relative_rms_error(chunked, reference) < TOLERANCE, (chunk_size, length)
            assert relative_rms_error(model(input_ids), chunked) == 0.0  # chunk is the default
            if chunk_size == 16:  # token-by-token forms do not depend on the chunk size
                recurrent = model(input_ids, form="recurrent")
                assert relative_rms_error(recurrent, reference) < TOLERANCE, length
                decoded = decode_all(model, input_ids, split=1)
                assert relative_rms_error(decoded, reference) < TOLERANCE, length


@pytest.mark.parametrize("name", MODELS)
@torch.no_grad()
def test_prompt_split_anywhere_decodes_like_one_pass(name: str) -> None:
    model = tiny_model(name)
    input_ids = torch.randint(0, 101, (3, 90))
    reference = model(input_ids, form="parallel")
    for split in (1, 2, 15, 16, 17, 64, 89, 90):
        decoded = decode_all(model, input_ids, split)
        assert relative_rms_error(decoded, reference[:, split - 1 :]) < TOLERANCE, split


@pytest.mark.parametrize("name", MODELS)
@torch.no_grad()
def test_prefill_continues_a_state_and_final_states_agree(name: str) -> None:
    """Prefilling in pieces gives the same state as prefilling at once or stepping every token."""
    model = tiny_model(name)
    input_ids = torch.randint(0, 101, (2, 75))
    _, whole = model.prefill(input_ids, max_new_tokens=0)
    logits, pieces = model.prefill(input_ids[:, :33], max_new_tokens=42)
    logits, pieces = model.prefill(input_ids[:, 33:70], state=pieces)
    logits, pieces = model.prefill(input_ids[:, 70:], state=pieces)
    _, stepped = model.prefill(input_ids[:, :1], max_new_tokens=74)
    for position in range(1, 75):
        _, stepped = model.step(input_ids[:, position], stepped)
    assert whole.position == pieces.position == stepped.position == 75
    for layer_whole, layer_pieces, layer_stepped in zip(whole.layers, pieces.layers, stepped.layers):
        if name == "transformer":
            pairs = [(layer_pieces.keys, layer_whole.keys), (layer_stepped.values, layer_whole.values)]
        else:
            assert all(state.dtype == torch.float32 for state in layer_whole)
            pairs = list(zip(layer_pieces, layer_whole)) + list(zip(layer_stepped, layer_whole))
        for actual, expected in pairs:
            assert relative_rms_error(actual, expected) < TOLERANCE


@pytest.mark.parametrize("name", ["mcsd-full", "mcsd-double_slope", "transformer"])
def test_parameter_gradients_agree_between_forms(name: str) -> None:
    model = tiny_model(name)
    input_ids = torch.randint(0, 101, (2, 70))

    def gradients(form: str) -> list[torch.Tensor]:
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(input_ids, form=form).flatten(0, 1), input_ids.flatten()).backward()
        return [param.grad.clone() for param in model.parameters()]

    for chunked, reference in zip(gradients("chunk"), gradients("parallel")):
        assert relative_rms_error(chunked, reference) < TOLERANCE


@torch.no_grad()
def test_mcsd_state_does_not_grow_with_length() -> None:
    model = tiny_model("mcsd-full")
    _, short = model.prefill(torch.randint(0, 101, (2, 5)))
    _, long = model.prefill(torch.randint(0, 101, (2, 500)))
    assert [s.shape for layer in short.layers for s in layer] == [s.shape for layer in long.layers for s in layer]
    assert all(s.shape == (2, 3, 8) for layer in long.layers for s in layer)


@torch.no_grad()
def test_transformer_cache_is_preallocated_and_written_in_place() -> None:
    model = tiny_model("transformer")
    _, state = model.prefill(torch.randint(0, 101, (2, 10)), max_new_tokens=5)
    cache = state.layers[0]
    storage = cache.keys.data_ptr()
    assert cache.keys.shape == (2, 3, 15, 8)
    for _ in range(5):
        _, state = model.step(torch.zeros(2, dtype=torch.long), state)
    assert state.layers[0].keys.data_ptr() == storage and state.position == 15
    with pytest.raises(ValueError, match="KV cache holds 15 tokens.*max_new_tokens"):
        model.step(torch.zeros(2, dtype=torch.long), state)
