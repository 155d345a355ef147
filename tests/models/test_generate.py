"""Greedy and sampled decoding on top of prefill/step."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

from helpers.models import relative_rms_error, tiny_model, tiny_model_to_compile
from mcsd.models import registry


@pytest.mark.parametrize("name", ["mcsd/full", "mcsd/decay_only", "transformer"])
@torch.no_grad()
def test_greedy_generate_equals_argmax_of_full_passes(name: str) -> None:
    model = tiny_model(name)
    prompt = torch.randint(0, 101, (2, 7))
    generated = model.generate(prompt, max_new_tokens=12)
    expected = prompt
    for _ in range(12):
        next_token = model(expected, form="parallel")[:, -1].argmax(-1, keepdim=True)
        expected = torch.cat([expected, next_token], dim=1)
    assert torch.equal(generated, expected)


@torch.no_grad()
def test_sampling_is_reproducible_and_top_k_one_is_greedy() -> None:
    model = tiny_model("mcsd")
    prompt = torch.randint(0, 101, (3, 5))

    def sample(seed: int, **options) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return model.generate(prompt, 10, temperature=1.0, generator=generator, **options)

    assert torch.equal(sample(1), sample(1))
    assert not torch.equal(sample(1), sample(2))
    assert torch.equal(sample(3, top_k=1), model.generate(prompt, 10))
    assert torch.equal(sample(4, top_p=1e-6), model.generate(prompt, 10))


@torch.no_grad()
def test_generation_stops_when_every_row_has_produced_eos() -> None:
    model = tiny_model("mcsd")
    prompt = torch.randint(0, 101, (2, 4))
    greedy = model.generate(prompt, 20)[:, 4:]
    eos = int(greedy[0, 2])
    first_eos = [int((row == eos).nonzero()[0]) if (row == eos).any() else None for row in greedy]
    stop = 20 if None in first_eos else max(first_eos) + 1
    expected = greedy[:, :stop].clone()
    for row, first in enumerate(first_eos):
        if first is not None:
            expected[row, first:] = eos  # a finished row keeps yielding eos
    assert torch.equal(model.generate(prompt, 20, eos_token_id=eos)[:, 4:], expected)
    alone = model.generate(prompt[:1], 20, eos_token_id=eos)[:, 4:]  # stops right after its eos
    assert torch.equal(alone, greedy[:1, : first_eos[0] + 1])


@torch.no_grad()
def test_stream_yields_one_token_per_row_per_step() -> None:
    model = tiny_model("transformer")
    tokens = list(model.stream(torch.randint(0, 101, (2, 3)), 6))
    assert len(tokens) == 6 and all(token.shape == (2,) for token in tokens)
    assert torch.equal(model.generate(torch.zeros(1, 3, dtype=torch.long), 0), torch.zeros(1, 3, dtype=torch.long))


@pytest.mark.slow
@pytest.mark.inductor  # compiled decoding on a CPU is a user's path (mcsd-bench compile=true, mcsd-generate)
@pytest.mark.parametrize("name", registry.architectures())
@torch.inference_mode()  # as generate's (a graph guards on its states being inference tensors)
def test_compiled_step_decodes_like_the_eager_step(name: str) -> None:
    """``step_function(compile=True)``: the eager step's logits up to float rounding, from one
    graph that serves every later position (nothing recompiles after the first steps), and
    the same greedy tokens through ``generate(compile=True)``."""
    torch._dynamo.reset()
    model = tiny_model_to_compile(name)
    ids = torch.randint(0, 101, (2, 40))
    _, state = model.prefill(ids[:, :5], max_new_tokens=40)
    twin = copy.deepcopy(state)
    step = model.step_function(compile=True)
    assert model.step_function(compile=True) is step and model.step_function() == model.step
    for position in range(5, 40):
        with torch.compiler.set_stance("fail_on_recompile" if position >= 7 else "default"):
            logits, state = step(ids[:, position].clone(), state)
        expected, twin = model.step(ids[:, position], twin)
        assert relative_rms_error(logits, expected) < 1e-6, position
    assert torch.equal(model.generate(ids[:, :5], 8, compile=True), model.generate(ids[:, :5], 8))


@pytest.mark.inductor
@pytest.mark.parametrize("name", ["mcsd", "transformer"])
@torch.no_grad()
def test_compiled_batch_one_step_multiplies_in_fused_kernels(name: str) -> None:
    """At batch 1 on a CPU the compiled step's graph (one, for every position) has every
    ``nn.Linear`` product but the LM head's as inductor's multiply-and-sum kernel
    (``decompose_mm_pass``: twice the read rate of the BLAS call at batch 1; the tiny models'
    weights are all within its 2048 x 2048 limit); the LM head is a multiply-and-sum of the
    step's own (not a product the pass would count), and the logits are the eager step's."""
    torch._dynamo.reset()
    counters.clear()
    model = tiny_model_to_compile(name)
    ids = torch.randint(0, 101, (1, 20))
    _, state = model.prefill(ids[:, :5], max_new_tokens=20)
    twin = copy.deepcopy(state)
    step = model.step_function(compile=True)
    for position in range(5, 20):
        logits, state = step(ids[:, position].clone(), state)
        expected, twin = model.step(ids[:, position], twin)
        assert relative_rms_error(logits, expected) < 1e-6, position
    linears = sum(isinstance(module, torch.nn.Linear) for module in model.modules())
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["inductor"]["decompose_mm"] + counters["inductor"]["decompose_addmm"] == linears - 1
