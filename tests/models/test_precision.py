"""Every registered architecture, in each of its variants, cast to bf16 and to fp16 (not autocast):
every form, decoding (eager; compiled for each architecture's default variant) and ``generate`` run
in the model's dtype within a stated tolerance of fp32, with recurrent states in fp32 (bf16 autocast
at N = 4096: tests/models/test_conformance.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from helpers.models import (ONE_LAYER_OF_EACH_KIND, SIXTEEN_BIT_TOLERANCE, assert_recurrent_states_stay_fp32,
                      decode_with_state, relative_rms_error, tiny_config, tiny_model, variant_cases)
import mcsd
from mcsd.data.tokenizer import train_tokenizer
from mcsd.errors import MCSDError
from mcsd.commands.generate import generate
from mcsd.models import registry
from mcsd.precision import model_dtype

CASES = variant_cases()
# Compiled decoding: each architecture's default variant in bfloat16. A variant changes what the
# step computes, not how it is compiled, and float16 traces the same code as bfloat16 (no step
# branches on which 16-bit dtype it holds): every variant decodes in both dtypes eagerly above; a
# compiled case costs 5-25 s here (issue 64: 12 more cases took ~190 s; the float16 cases took 70 s, 2026-12-07).
# Traced without inductor (tests/conftest.py): 16-bit decoding is a GPU's, where inductor
# compiles it (tests/gpu/test_gpu.py, each default variant in bf16); fp32 compiled decoding goes through
# inductor here for every architecture (tests/models/test_generate.py).
DEFAULT_CASES = [f"{name}/{next(iter(registry.get(name).variants))}" for name in registry.architectures()]
COMPILED_CASES = [(case, torch.bfloat16) for case in DEFAULT_CASES]


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


@pytest.mark.slow
@pytest.mark.parametrize(("case", "dtype"), COMPILED_CASES, ids=str)
@torch.inference_mode()  # as generate's: its states are inference tensors too, which a graph guards on
def test_a_model_cast_to_16_bits_decodes_compiled(case: str, dtype: torch.dtype) -> None:
    """The compiled step of a 16-bit model (one layer of each kind): the fp32 model's logits within
    :data:`SIXTEEN_BIT_TOLERANCE` along a fixed token path, recurrent states fp32, and
    ``generate(compile=True)`` runs."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
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
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it was traced


def test_dtype_auto_is_bf16_on_a_gpu_that_supports_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dtype=auto`` (mcsd-generate, mcsd-eval, mcsd-probe): fp32 on a CPU, bf16 on a GPU with bf16,
    fp32 on one without; a name is that dtype; anything else is one line with the choices."""
    assert model_dtype("auto", "cpu") == torch.float32
    assert model_dtype("bfloat16", "cpu") == torch.bfloat16 and model_dtype("float16", "cpu") == torch.float16
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert model_dtype("auto", "cuda") == torch.bfloat16 and model_dtype("auto", "cuda:1") == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert model_dtype("auto", "cuda") == torch.float32
    with pytest.raises(MCSDError, match="^dtype='float64' is not a dtype: use auto, float32, bfloat16, float16$"):
        model_dtype("float64", "cpu")


def test_one_vocabulary_names_every_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's precision strings, FSDP2's mixed_precision and the dtype names map to one set of
    dtypes; ``auto`` is the same choice everywhere (bf16 only on a GPU that supports it)."""
    from mcsd.precision import DTYPES, Precision, dtype_name, mixed_precision_dtype

    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    expected = {"bf16-mixed": (fp32, bf16), "bf16-true": (bf16, bf16), "16-mixed": (fp32, fp16), "16-true": (fp16, fp16),
                16: (fp32, fp16), "32-true": (fp32, fp32), 32: (fp32, fp32), "64-true": (fp32, fp32), None: (fp32, fp32)}
    read = {given: Precision.of_trainer(given) for given in expected}
    assert {given: (precision.weights, precision.compute) for given, precision in read.items()} == expected
    assert [read[name].name for name in ("bf16-mixed", "bf16-true", "16-mixed", "16-true", "32-true")] == [
        "bf16-mixed", "bf16-true", "16-mixed", "16-true", "32-true"]  # its name is the string it reads
    assert (Precision.mixed(bf16).name, Precision.cast(bf16).name, Precision.mixed(fp32).name) == (
        "bf16-mixed", "bf16-true", "32-true")  # the bench's training step and its decoding
    assert Precision.mixed(bf16).autocast("cpu")._enabled and not Precision.cast(bf16).autocast("cpu")._enabled
    assert [dtype_name(dtype) for dtype in DTYPES.values()] == list(DTYPES)
    assert (mixed_precision_dtype("fp32", "cuda"), mixed_precision_dtype("bf16", "cpu")) == (torch.float32, torch.bfloat16)
    assert mixed_precision_dtype("auto", "cpu") == torch.float32
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert mixed_precision_dtype("auto", "cuda") == torch.float32  # an older GPU: fp32, as dtype=auto
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert mixed_precision_dtype("auto", "cuda") == model_dtype("auto", "cuda") == torch.bfloat16


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@torch.no_grad()
def test_mcsd_generate_decodes_in_the_dtype_it_is_given(tmp_path: Path, dtype: str) -> None:
    """``mcsd-generate dtype=...``: the saved model loaded in that dtype (its greedy tokens, not the
    fp32 model's) continues the prompt."""
    text = "the king of a far land ships gold and silver to every harbour along the coast\n\n" * 20
    tokenizer = train_tokenizer([text], 300)
    saved = mcsd.save(mcsd.build_model(tiny_config("mcsd", vocab_size=300)), tmp_path / "model", tokenizer)
    cfg = OmegaConf.create({"ckpt": str(saved), "prompt": "the king", "max_new_tokens": 10, "temperature": 0,
                            "top_k": None, "top_p": None, "seed": 0, "device": "cpu", "dtype": dtype,
                            "stop_at_eos": False, "compile": False, "cuda_graphs": False})
    model = mcsd.load(saved, dtype=getattr(torch, dtype))
    assert model.embed.weight.dtype == getattr(torch, dtype)
    ids = torch.tensor([tokenizer.encode("the king").ids])
    assert generate(cfg) == "the king" + tokenizer.decode(model.generate(ids, 10)[0, ids.shape[1]:].tolist())


@pytest.mark.parametrize("name", registry.architectures())
@torch.no_grad()
def test_a_16_bit_model_keeps_documents_apart_in_every_form(name: str) -> None:
    """``position_ids`` (documents of 1, 2, 30 and 17 tokens packed in each row) in a model cast to
    bf16 and to fp16: every form within :data:`SIXTEEN_BIT_TOLERANCE` of the fp32 model's logits
    with the same documents (the masks, the -inf log-decays and the WKV's masked logits hold in
    16 bits; states and carries stay fp32)."""
    model = tiny_model(name)
    position_ids = torch.cat([torch.arange(length) for length in (1, 2, 30, 17)]).repeat(2, 1)
    input_ids = torch.randint(0, 101, position_ids.shape)
    reference = model(input_ids, form="parallel", position_ids=position_ids)
    for dtype, tolerance in SIXTEEN_BIT_TOLERANCE.items():
        cast = copy.deepcopy(model).to(dtype)
        for form in registry.get(name).forms:
            logits = cast(input_ids, form=form, position_ids=position_ids)
            assert logits.dtype == dtype and relative_rms_error(logits, reference) < tolerance, (dtype, form)
