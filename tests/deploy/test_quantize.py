"""Weights in 8 and 4 bits (mcsd.deploy.quantize) for every registered architecture: which weights
change format, every form and decoding agreeing with each other and near the full-precision model,
and the settings refused in one line."""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

pytest.importorskip("torchao")

from helpers.models import decode_all, relative_rms_error, tiny_model  # noqa: E402
from helpers.runs import run_bench, run_here  # noqa: E402
from mcsd.deploy.quantize import (  # noqa: E402
    INT4_GROUP_SIZE,
    check_weight_format,
    decoding_dtype,
    int4_fits,
    quantize_weights,
    quantized_linears,
    stored_bytes,
    weight_format,
)
from mcsd.errors import MCSDError  # noqa: E402
from mcsd.models import registry  # noqa: E402
from mcsd.plots.cost import points_dtype, model_label, read_results  # noqa: E402

# Widths that every int4 group divides (the tiny models' 24 would leave every linear whole).
WIDE = dict(hidden_size=64, num_channels=4, mlp_hidden_size=128, vocab_size=128)
FORMAT_DTYPES = {"int8": torch.float32, "int4": torch.bfloat16}
# Relative RMS error of the logits against the full model in the same dtype, for a randomly
# initialised model (whose weights are Gaussian: the worst case for a grid of 2^4 levels).
FORMAT_TOLERANCE = {"int8": 0.03, "int4": 0.25}


def quantized(name: str, weights: str, **fields) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    full = tiny_model(name, **{**WIDE, **fields}).to(FORMAT_DTYPES[weights])
    return full, quantize_weights(copy.deepcopy(full), weights)


@pytest.mark.parametrize("weights", ["int8", "int4"])
@pytest.mark.parametrize("name", registry.architectures())
def test_every_form_and_decoding_of_a_quantized_model_agree(name: str, weights: str) -> None:
    full, model = quantized(name, weights)
    assert weight_format(model) == weights
    # Every linear is quantized (int4: every one its kernel tiles), the head too; the embedding stays whole.
    linears = {name: module for name, module in full.named_modules() if isinstance(module, nn.Linear)}
    expected = {name: weights == "int8" or int4_fits(module) for name, module in linears.items()}
    assert {name: kind != "full" for name, kind in quantized_linears(model).items()} == expected
    assert expected["lm_head"] and sum(expected.values()) > len(expected) // 2
    assert type(model.embed.weight) is nn.Parameter
    ids = torch.randint(0, WIDE["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = full(ids, form=full.architecture.train_form).float()
        outputs = {form: model(ids, form=form).float() for form in model.architecture.forms}
        decoded = decode_all(model, ids, 24).float()
    for form, logits in outputs.items():
        assert relative_rms_error(logits, reference) < FORMAT_TOLERANCE[weights], form
        # The forms of one quantized model agree as the full model's do in its dtype.
        assert relative_rms_error(logits, outputs[model.architecture.train_form]) < 2e-2, form
    assert relative_rms_error(decoded, outputs[model.architecture.train_form][:, 23:]) < 2e-2


def test_int8_scales_each_output_row_and_keeps_the_recurrent_state_fp32() -> None:
    full, model = quantized("mcsd", "int8")
    layer = model.layers[0].mixer.out_proj.weight
    original = full.layers[0].mixer.out_proj.weight.detach()
    dequantized = layer.dequantize()
    # One symmetric scale per output row: the largest entry of each row is exact to its 127 levels.
    assert torch.allclose(dequantized, original, atol=(original.abs().amax(1, keepdim=True) / 127).max().item())
    assert (dequantized - original).abs().max() > 0
    with torch.no_grad():
        _, state = model.prefill(torch.randint(0, 128, (1, 8)))
    assert all(tensor.dtype == torch.float32 for layer_state in state.layers for tensor in layer_state.mixer)


def test_a_tied_head_is_quantized_apart_from_the_embedding() -> None:
    full, model = quantized("transformer", "int8", tie_embeddings=True)
    assert full.lm_head.weight is full.embed.weight
    assert type(model.lm_head.weight).__name__ == "Int8Tensor"
    assert torch.equal(model.embed.weight, full.embed.weight)


def test_int4_groups_the_inputs_and_leaves_narrow_linears_whole() -> None:
    torch.manual_seed(0)
    model = tiny_model("transformer", hidden_size=48, num_channels=4, mlp_hidden_size=64, vocab_size=64)
    quantize_weights(model.to(torch.bfloat16), "int4")
    formats = quantized_linears(model)
    # Inputs of 48 are no multiple of the group of 32: those linears stay whole; 64 inputs are two groups.
    assert 48 % INT4_GROUP_SIZE and not 64 % INT4_GROUP_SIZE
    assert formats["layers.0.mlp.down"] == "Int4OpaqueTensor"
    assert formats["layers.0.mixer.qkv_proj"] == "full" and formats["lm_head"] == "full"


@pytest.mark.inductor  # inductor's int8 pattern is the subject
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_step_of_a_quantized_model_matches_its_eager_step(dtype: torch.dtype) -> None:
    """The compiled int8 step decodes as the eager one; with bfloat16 activations inductor rewrites
    every int8 product into torch's ``_weight_int8pack_mm`` (its weight-only pattern), which it
    does not with fp32 ones: why ``dtype=auto`` runs int8 in bfloat16 on a CPU."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = quantize_weights(tiny_model("mcsd", **WIDE).to(dtype), "int8")
    ids = torch.randint(0, WIDE["vocab_size"], (1, 20), generator=torch.Generator().manual_seed(2))
    counters.clear()
    with torch.no_grad():
        eager = decode_all(model, ids, 12)
        compiled = decode_all(model, ids, 12, compile=True)
    assert relative_rms_error(compiled.float(), eager.float()) < (1e-5 if dtype == torch.float32 else 2e-2)
    linears = sum(isinstance(module, nn.Linear) for module in model.modules())
    # One rewrite per int8 linear of the step graph, in bfloat16 only.
    assert counters["inductor"]["woq_matcher_count"] == (linears if dtype == torch.bfloat16 else 0)


@pytest.mark.parametrize("dtype, weights, expected", [
    ("auto", "int8", torch.bfloat16), ("auto", "int4", torch.bfloat16), ("auto", "full", torch.float32),
    ("float32", "int8", torch.float32), ("bfloat16", "int8", torch.bfloat16),
])
def test_dtype_auto_runs_a_cpu_weight_format_on_its_kernels_activations(dtype, weights, expected) -> None:
    assert decoding_dtype(dtype, weights, "cpu") == expected


@pytest.mark.parametrize("weights, dtype, device, message", [
    ("int3", None, "cpu", "weights='int3' is not a weight format: use full, int8, int4"),
    ("int4", torch.float32, "cpu", "weights=int4 runs on bfloat16 activations"),
    ("int4", None, "cuda", "weights=int4 is a CPU format"),
])
def test_a_weight_format_that_cannot_run_is_one_line(weights, dtype, device, message) -> None:
    with pytest.raises(MCSDError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        check_weight_format(weights, dtype, device)
    assert "\n" not in str(error.value)


def test_quantizing_twice_or_while_training_is_refused() -> None:
    _, model = quantized("retnet", "int8")
    with pytest.raises(MCSDError, match="already int8"):
        quantize_weights(model, "int8")
    training = tiny_model("retnet", **WIDE).train()
    with pytest.raises(MCSDError, match=r"call model.eval\(\) first"):
        quantize_weights(training, "int8")


def test_weights_are_a_bench_axis_with_the_bytes_each_step_reads(tmp_path: Path) -> None:
    """``weights=[full,int8,int4]``: each point measured with each format, side by side; each row
    says its format and the bytes its weights hold as stored (int8: a byte per weight and a scale
    per row; int4: half a byte and a scale and zero per 32 inputs), drawn as series of their own."""
    csv_path = run_bench(tmp_path, "model_size=tiny", "models=[transformer]", "weights=[full,int8,int4]",
                         "inference.batch_sizes=[1]", "inference.gen_lengths=[4]", "inference.prompt_len=8",
                         "inference.repeats=1", "inference.warmup=0", "isolate=false")  # tiny: widths of 64 and 192, which int4 tiles
    frame = pd.read_csv(csv_path)
    assert list(frame["weights"]) == ["full", "int8", "int4"] and (frame["status"] == "ok").all()
    full, int8, int4 = (frame[frame["weights"] == name].iloc[0] for name in ("full", "int8", "int4"))
    assert int8.step_weight_bytes < 0.3 * full.step_weight_bytes and int4.step_weight_bytes < int8.step_weight_bytes
    assert full.params == int8.params == int4.params
    # Each row says the dtype it ran in: int4, and int8 on a CPU, in bfloat16 (the rows said float32, the grid's).
    assert list(frame["dtype"]) == ["float32", "bfloat16", "bfloat16"]
    head, points = read_results(csv_path)
    assert points_dtype(head, points) == "float32 (full), bfloat16 (int8/int4)"
    labels = [model_label(arch, model) for arch, model in zip(*[read_results(csv_path)[1][key] for key in ("arch", "model")])]
    assert labels == ["Transformer, full weights", "Transformer, int8 weights", "Transformer, int4 weights"]


def test_a_weights_axis_that_cannot_run_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(MCSDError, match=r"weights=\['int9'\] must be a list of some of full, int8, int4"):
        run_bench(tmp_path, "weights=[int9]")
    with pytest.raises(MCSDError, match="quantized weights are for decoding"):
        run_bench(tmp_path, "mode=train", "weights=[int8]")
    assert not any(tmp_path.iterdir())


def test_stored_bytes_count_a_quantized_weights_integers_and_scales() -> None:
    full, model = quantized("transformer", "int8")
    weight = model.layers[0].mlp.down.weight  # [64, 128]: 64 rows of 128 int8, an fp32 scale and int8 zero per row
    assert stored_bytes(weight) == 64 * 128 + 64 * 4 + 64
    assert stored_bytes(full.layers[0].mlp.down.weight) == 64 * 128 * 4
    _, int4 = quantized("transformer", "int4")
    packed = stored_bytes(int4.layers[0].mlp.down.weight)
    assert packed == 64 * 128 // 2 + (128 // INT4_GROUP_SIZE) * 64 * 2 * 2  # nibbles; bf16 scale and zero per group


def test_mcsd_generate_decodes_with_quantized_weights(tmp_path: Path) -> None:
    import mcsd
    from mcsd.commands.generate import generate as mcsd_generate
    from mcsd.data.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(["the king of a far land ships gold and silver to every harbour\n\n" * 20], 300)
    torch.manual_seed(0)
    saved = mcsd.save(tiny_model("mcsd", **{**WIDE, "vocab_size": 320}), tmp_path / "saved", tokenizer)
    settings = {"ckpt": str(saved), "prompt": "the king", "max_new_tokens": 12, "temperature": 0, "top_k": None,
                "top_p": None, "seed": 0, "device": "cpu", "stop_at_eos": False, "compile": False, "cuda_graphs": False}
    for weights, dtype in [("int8", "auto"), ("int4", "auto")]:
        text = mcsd_generate(OmegaConf.create({**settings, "weights": weights, "dtype": dtype}))
        model = quantize_weights(mcsd.load(saved, dtype=torch.bfloat16), weights)  # dtype=auto's on a CPU
        ids = torch.tensor([tokenizer.encode("the king").ids])
        assert text == "the king" + tokenizer.decode(model.generate(ids, 12)[0, ids.shape[1]:].tolist())
    refused = run_here("mcsd-generate", f"ckpt={saved}", "weights=int4", "dtype=float32")
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "mcsd-generate: error: weights=int4 runs on bfloat16 activations (its CPU kernel's fast path), not float32: "
        "set dtype=bfloat16 or dtype=auto")
