"""Every registered architecture, in each of its variants, cast to bf16 and to fp16 (not autocast):
every form, decoding (eager and compiled) and ``generate`` run in the model's dtype within a stated
tolerance of fp32, with recurrent states in fp32 (bf16 autocast at N = 4096: tests/test_conformance.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import (ONE_LAYER_OF_EACH_KIND, SIXTEEN_BIT_TOLERANCE, assert_recurrent_states_stay_fp32,
                      decode_with_state, relative_rms_error, tiny_model, variant_cases)
from mcsd.models import registry

CASES = variant_cases()


@pytest.mark.parametrize("dtype", list(SIXTEEN_BIT_TOLERANCE), ids=str)
@pytest.mark.parametrize("case", CASES)
@torch.no_grad()
def test_a_model_cast_to_16_bits_runs_every_form_and_decodes(case: str, dtype: torch.dtype) -> None:
    """``model.to(bfloat16 / float16)`` (a cast, not autocast): every form, a prefill followed by
    steps and ``generate`` run in the model's dtype, within :data:`SIXTEEN_BIT_TOLERANCE` of the
    fp32 model's logits; recurrent states stay fp32."""
    tolerance = SIXTEEN_BIT_TOLERANCE[dtype]
    model = tiny_model(case)
    input_ids = torch.randint(0, 101, (2, 40))
    reference = model(input_ids, form="parallel")
    cast = copy.deepcopy(model).to(dtype)
    for form in registry.get(case.split("/")[0]).forms:
        logits = cast(input_ids, form=form)
        assert logits.dtype == dtype and relative_rms_error(logits, reference) < tolerance, form
    decoded, state = decode_with_state(cast, input_ids, split=17)
    assert decoded.dtype == dtype and relative_rms_error(decoded, reference[:, 16:]) < tolerance
    assert_recurrent_states_stay_fp32(cast, state)
    generated = cast.generate(input_ids[:, :5], 6)
    assert generated.shape == (2, 11) and torch.equal(generated[:, :5], input_ids[:, :5])


@pytest.mark.parametrize("dtype", list(SIXTEEN_BIT_TOLERANCE), ids=str)
@pytest.mark.parametrize("case", CASES)
@torch.no_grad()
def test_a_model_cast_to_16_bits_decodes_compiled(case: str, dtype: torch.dtype) -> None:
    """The compiled step of a 16-bit model (one layer of each kind): the fp32 model's logits within
    :data:`SIXTEEN_BIT_TOLERANCE` along a fixed token path, recurrent states fp32, and
    ``generate(compile=True)`` runs."""
    name = case.split("/")[0]
    model = tiny_model(case, **ONE_LAYER_OF_EACH_KIND.get(name, {"num_layers": 1}))
    input_ids = torch.randint(0, 101, (2, 24))
    reference = model(input_ids, form="parallel")
    cast = copy.deepcopy(model).to(dtype)
    decoded, state = decode_with_state(cast, input_ids, split=9, compile=True)
    assert decoded.dtype == dtype and relative_rms_error(decoded, reference[:, 8:]) < SIXTEEN_BIT_TOLERANCE[dtype]
    assert_recurrent_states_stay_fp32(cast, state)
    generated = cast.generate(input_ids[:, :5], 6, compile=True)
    assert generated.shape == (2, 11) and torch.equal(generated[:, :5], input_ids[:, :5])
