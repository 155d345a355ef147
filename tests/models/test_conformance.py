"""The conformance suite: every registered architecture, in each of its variants, is one
function in its parallel, chunkwise and recurrent forms, decodes any number of tokens after
a prefill, keeps its gradients across forms, survives bf16 at N = 4096, round-trips through
save/load and counts its parameters on the meta device (cast to 16 bits: tests/models/test_precision.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from helpers.models import decode_all, relative_rms_error, tiny_config, tiny_model, variant_cases

import mcsd
from mcsd.models import registry

TOLERANCE = 1e-5
LENGTHS = [1, 2, 63, 64, 65, 301]
CASES = variant_cases()
ARCHITECTURES = registry.architectures()


def test_registry_lists_the_built_in_architectures() -> None:
    assert mcsd.architectures() == ARCHITECTURES and {"mcsd", "transformer"} <= set(ARCHITECTURES)
    for name in ARCHITECTURES:
        architecture = registry.get(name)
        assert architecture.model_class.architecture is architecture
        assert architecture.train_form in architecture.forms
        assert registry.of_config(architecture.config_class) is architecture
    with pytest.raises(mcsd.ConfigError, match="architecture 'nope' is not registered: use one of mcsd, transformer"):
        registry.get("nope")
    with pytest.raises(mcsd.ConfigError, match="is registered already"):
        mcsd.register(registry.get("mcsd"))


@pytest.mark.parametrize("case", CASES)
@torch.no_grad()
def test_forms_agree_at_every_length_and_chunk_size(case: str) -> None:
    forms = registry.get(case.split("/")[0]).forms
    for chunk_size in (16, 64):
        model = tiny_model(case, chunk_size=chunk_size)
        for length in LENGTHS:
            input_ids = torch.randint(0, 101, (2, length))
            reference = model(input_ids, form="parallel")
            assert reference.shape == (2, length, 101)
            assert torch.equal(model(input_ids), model(input_ids, form=model.default_form))
            if "chunk" in forms:
                assert relative_rms_error(model(input_ids, form="chunk"), reference) < TOLERANCE, (chunk_size, length)
            if chunk_size == 16:  # token-by-token forms do not depend on the chunk size
                if "recurrent" in forms:
                    recurrent = model(input_ids, form="recurrent")
                    assert relative_rms_error(recurrent, reference) < TOLERANCE, length
                decoded = decode_all(model, input_ids, split=1)
                assert relative_rms_error(decoded, reference) < TOLERANCE, length


@pytest.mark.parametrize("case", CASES)
@torch.no_grad()
def test_forms_agree_to_round_off_in_float64(case: str) -> None:
    """In an fp64 model every form (and the lean step) follows the input's dtype: the forms
    agree to fp64 round-off, unless the architecture fixes constants in fp32 by design (MCSD),
    where they agree to those constants' precision."""
    architecture = registry.get(case.split("/")[0])
    model = tiny_model(case).double()
    input_ids = torch.randint(0, 101, (2, 70))
    reference = model(input_ids, form="parallel")
    tolerance = 1e-6 if architecture.fp32_constants else 1e-14
    for form in architecture.forms:
        assert relative_rms_error(model(input_ids, form=form), reference) < tolerance, form
    assert relative_rms_error(decode_all(model, input_ids, split=5), reference[:, 4:]) < tolerance


@pytest.mark.parametrize("name", ARCHITECTURES)
@torch.no_grad()
def test_a_model_without_mlps_is_its_mixers_alone(name: str) -> None:
    """``mlp_hidden_size=0``: no MLP and no norm before it in any layer; the forms still agree and
    the parameters are the full model's less its MLPs and their norms."""
    full, bare = tiny_model(name), tiny_model(name, mlp_hidden_size=0)
    assert all(layer.mlp is None and layer.mlp_norm is None for layer in bare.layers)
    mlps = sum(p.numel() for layer in full.layers for module in (layer.mlp, layer.mlp_norm) for p in module.parameters())
    assert sum(p.numel() for p in bare.parameters()) == sum(p.numel() for p in full.parameters()) - mlps
    input_ids = torch.randint(0, 101, (2, 40))
    reference = bare(input_ids, form="parallel")
    for form in registry.get(name).forms:
        assert relative_rms_error(bare(input_ids, form=form), reference) < TOLERANCE, form
    assert relative_rms_error(decode_all(bare, input_ids, split=3), reference[:, 2:]) < TOLERANCE
    with pytest.raises(mcsd.ConfigError, match="mlp_hidden_size=0 .no MLP. leaves nothing to size"):
        mcsd.build_model(tiny_config(name, mlp_hidden_size=0, equal_params_to="mcsd"))


@pytest.mark.parametrize("case", CASES)
@torch.no_grad()
def test_prompt_split_anywhere_decodes_like_one_pass(case: str) -> None:
    model = tiny_model(case)
    input_ids = torch.randint(0, 101, (3, 90))
    reference = model(input_ids, form="parallel")
    for split in (1, 2, 15, 16, 17, 64, 89, 90):
        decoded = decode_all(model, input_ids, split)
        assert relative_rms_error(decoded, reference[:, split - 1 :]) < TOLERANCE, split


@pytest.mark.parametrize("case", CASES)
@torch.no_grad()
def test_step_is_the_recurrent_form_on_one_token(case: str) -> None:
    """``model.step`` (each mixer's lean step) gives the logits and states of the recurrent form
    run on a sequence of one token, at the first position and later ones (so the states they
    leave agree too), to the last bits of fp32: the same operations, on ``[B, D]`` rather than
    ``[B, 1, D]``, for which a product (a grouped projection's einsum) may take another BLAS path
    (1 ulp here and there: seen with the weights seed 0 draws since issue 54)."""
    model = tiny_model(case)
    input_ids = torch.randint(0, 101, (2, 40))
    _, state = model.prefill(input_ids[:, :20])
    for start, position in ((model.init_state(2, 40), 0), (state, 20)):
        twin = copy.deepcopy(start)
        for offset in range(3):
            token = input_ids[:, position + offset]
            hidden, twin = model.run(token[:, None], twin, "recurrent")
            logits, start = model.step(token, start)
            assert relative_rms_error(logits, model.lm_head(hidden[:, -1])) < 1e-7, (position, offset)
            assert start.position == twin.position == position + offset + 1


@pytest.mark.parametrize("name", ARCHITECTURES)
@torch.no_grad()
def test_decoding_never_needs_its_length_in_advance(name: str) -> None:
    """prefill(ids) with no hint, then any number of steps, equals one pass."""
    model = tiny_model(name)
    input_ids = torch.randint(0, 101, (2, 150))
    reference = model(input_ids, form="parallel")
    for split in (1, 7, 64):
        decoded = decode_all(model, input_ids, split, hint=False)
        assert relative_rms_error(decoded, reference[:, split - 1 :]) < TOLERANCE, split


@pytest.mark.parametrize("name", ARCHITECTURES)
@torch.no_grad()
def test_prefill_continues_a_state(name: str) -> None:
    """A state prefilled in pieces, at once, or token by token decodes the same next tokens
    (the initial state of each later call is the final state of the one before)."""
    model = tiny_model(name)
    input_ids = torch.randint(0, 101, (2, 80))
    reference = model(input_ids, form="parallel")[:, 74:]
    _, whole = model.prefill(input_ids[:, :75])
    _, pieces = model.prefill(input_ids[:, :33], max_new_tokens=3)
    _, pieces = model.prefill(input_ids[:, 33:70], state=pieces)
    _, pieces = model.prefill(input_ids[:, 70:75], state=pieces)
    _, stepped = model.prefill(input_ids[:, :1])
    for position in range(1, 75):
        _, stepped = model.step(input_ids[:, position], stepped)
    for state in (whole, pieces, stepped):
        assert state.position == 75
        logits, _ = model.prefill(input_ids[:, 75:], state=state)
        assert relative_rms_error(logits, reference[:, -1]) < TOLERANCE


@pytest.mark.parametrize("case", CASES)
def test_gradients_agree_between_forms(case: str) -> None:
    model = tiny_model(case)
    with torch.no_grad():  # break symmetries whose gradients are exactly zero (identical perspectives: W_agg's)
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    input_ids = torch.randint(0, 101, (2, 70))

    def gradients(form: str) -> list[torch.Tensor]:
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(input_ids, form=form).flatten(0, 1), input_ids.flatten()).backward()
        return [param.grad.clone() for param in model.parameters()]

    reference = gradients("parallel")
    for form in set(registry.get(case.split("/")[0]).forms) - {"parallel", "recurrent"}:
        for actual, expected in zip(gradients(form), reference):
            assert relative_rms_error(actual, expected) < TOLERANCE, form


@pytest.mark.parametrize("case", CASES)
def test_activation_checkpointing_keeps_values_and_gradients_in_every_form(case: str) -> None:
    """``activation_checkpointing``: each layer keeps only its input for the backward and computes
    the rest again; in every form the loss and every gradient are the same, bit for bit."""
    torch.manual_seed(0)
    model = tiny_model(case)
    torch.manual_seed(0)
    checkpointed = tiny_model(case, activation_checkpointing=True)
    input_ids = torch.randint(0, 101, (2, 40))
    for form in registry.get(case.split("/")[0]).forms:
        results = []
        for each in (model, checkpointed):
            each.zero_grad()
            loss = torch.nn.functional.cross_entropy(each(input_ids, form=form).flatten(0, 1), input_ids.flatten())
            loss.backward()
            results.append([loss, *(param.grad for param in each.parameters())])
        assert all(torch.equal(a, b) for a, b in zip(*results)), form


@pytest.mark.parametrize("name", ARCHITECTURES)
@torch.no_grad()
def test_bf16_autocast_at_4096_tokens(name: str) -> None:
    model = tiny_model(name, vocab_size=257, hidden_size=40, num_channels=10, mlp_hidden_size=64, chunk_size=64)
    input_ids = torch.randint(0, 257, (1, 4096))
    reference = model(input_ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, _ = model.prefill(input_ids)
        full = model(input_ids)
    assert torch.isfinite(full).all()
    assert relative_rms_error(full.float(), reference) < 5e-2
    assert relative_rms_error(logits.float(), reference[:, -1]) < 5e-2


@pytest.mark.parametrize("case", CASES)
def test_save_load_round_trip_and_meta_count(case: str, tmp_path: Path) -> None:
    model = tiny_model(case)
    mcsd.save(model, tmp_path / "model")
    loaded = mcsd.load(tmp_path / "model")
    assert loaded.config == model.config and not loaded.training
    input_ids = torch.randint(0, 101, (2, 20))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids), model(input_ids))
    assert mcsd.count_parameters(tiny_config(case)) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("case", CASES)
@torch.no_grad()
def test_every_parameter_is_initialised_once_on_its_device_and_dtype(case: str) -> None:
    """``build_model`` makes the modules on the meta device and initialises every parameter once
    (:meth:`CausalLM.reset_parameters` writes each of them: an allocated model filled with NaN has
    none left); in a 16-bit dtype the values are drawn in it, the same for the same seed; the
    weights that write into the residual stream come out at init_std / sqrt(2 L)."""
    config = tiny_config(case, hidden_size=48, num_channels=3, mlp_hidden_size=64, num_layers=3, init_std=0.5)
    with torch.device("meta"):
        empty = mcsd.build_model(config)
    assert all(parameter.is_meta for parameter in empty.parameters())
    empty.to_empty(device="cpu")
    for parameter in empty.parameters():
        parameter.fill_(float("nan"))
    empty.tie_weights()
    empty.reset_parameters()
    assert all(torch.isfinite(parameter).all() for parameter in empty.parameters())
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(3)
        model = mcsd.build_model(config, dtype=dtype)
        torch.manual_seed(3)
        again = mcsd.build_model(config, device="cpu", dtype=dtype)
        assert {parameter.dtype for parameter in model.parameters()} == {dtype}
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    residual = torch.cat([weight.float().flatten() for layer in model.layers for weight in layer.residual_weights()])
    assert residual.std().item() == pytest.approx(0.5 / 6**0.5, rel=0.05)


@torch.no_grad()
def test_a_tied_model_builds_and_loads_with_one_weight(tmp_path: Path) -> None:
    """``tie_embeddings``: one parameter for the embedding and the LM head, after the meta-device
    build and after loading (a file holds it once), in any dtype."""
    model = tiny_model("mcsd", tie_embeddings=True)
    assert model.lm_head.weight is model.embed.weight
    mcsd.save(model, tmp_path / "tied")
    for dtype in (torch.float32, torch.bfloat16):
        loaded = mcsd.load(tmp_path / "tied", dtype=dtype)
        assert loaded.lm_head.weight is loaded.embed.weight and loaded.embed.weight.dtype == dtype
        assert torch.equal(loaded.embed.weight, model.embed.weight.to(dtype))


class RecordAttentionWidths(torch.overrides.TorchFunctionMode):
    """The head widths (query, key, value) of every ``scaled_dot_product_attention`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.widths: list[tuple[int, int, int]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.widths.append(tuple(tensor.shape[-1] for tensor in args[:3]))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ARCHITECTURES)
@torch.no_grad()
def test_every_attention_call_at_the_paper_size_has_a_fused_kernel_width(name: str) -> None:
    """At ``size=1.6b`` (on the meta device: no memory), every SDPA call of every form, of a prefill
    and of a decoding step has heads whose width is a multiple of 8, which the fused GPU kernels
    take (the hybrid's folded key bias made 257 before it was padded). One layer of each kind: the
    widths are the width's and the heads', not the depth's (12 layers took 37 s for all, here)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from mcsd.ops.attention import FUSED_WIDTH_MULTIPLE

    with initialize_config_module("mcsd.conf", version_base="1.3"):
        node = OmegaConf.to_container(compose("build", overrides=[f"model={name}", "size=1.6b"]).model, resolve=True)
    node["num_layers"] = node.get("attention_every") or 1  # the hybrid: one attention layer after its others
    with torch.device("meta"):
        model = mcsd.build_model(node)
    ids = torch.zeros(1, 80, dtype=torch.long, device="meta")
    with RecordAttentionWidths() as recorded:
        for form in registry.get(name).forms:
            model(ids, form=form)
        _, state = model.prefill(ids, max_new_tokens=2)
        model.step(ids[:, 0], state)
    assert all(width % FUSED_WIDTH_MULTIPLE == 0 for widths in recorded.widths for width in widths), recorded.widths
    has_attention = any(layer.mixer.state_rewinds for layer in model.layers)
    assert bool(recorded.widths) == has_attention


DOCUMENT_LENGTHS = [1, 2, 63, 64, 65, 301]


def document_position_ids(lengths: list[int]) -> torch.Tensor:
    """``[1, sum(lengths)]``: each token's position in its document (0 where one starts)."""
    return torch.cat([torch.arange(length) for length in lengths])[None]


@pytest.mark.parametrize("case", CASES)
def test_a_left_padded_batch_decodes_each_row_at_its_own_position(case: str) -> None:
    """Rows of 7, 3 and 5 tokens left-padded to 7, the padding one document and the row the next
    (``position_ids``): the prefill's state decodes every row at its own position
    (``DecodingState.positions``), each step's logits those of the row alone (fp64); a state of
    rows at different positions refuses a multi-token continuation in one line."""
    model = tiny_model(case, chunk_size=16).double()
    if not model.separates_documents:
        return  # refused at the prefill (the packed-batch test above)
    tolerance = 1e-6 if registry.get(case.split("/")[0]).fp32_constants else 1e-12
    lengths, width = [7, 3, 5], 7
    rows = [torch.randint(1, 101, (length,)) for length in lengths]
    input_ids = torch.stack([torch.cat([torch.zeros(width - len(row), dtype=torch.long), row]) for row in rows])
    position_ids = torch.stack([torch.cat([torch.arange(width - len(row)), torch.arange(len(row))]) for row in rows])
    following = torch.randint(1, 101, (3, 4))
    with torch.no_grad():
        logits, state = model.prefill(input_ids, position_ids=position_ids)
        assert state.positions.tolist() == lengths and state.position == width
        batched = [logits]
        for column in following.T:
            logits, state = model.step(column, state)
            batched.append(logits)
        assert state.positions.tolist() == [length + 4 for length in lengths]
        for index, row in enumerate(rows):
            logits, alone = model.prefill(row[None])
            steps = [logits]
            for column in following[index]:
                logits, alone = model.step(column[None], alone)
                steps.append(logits)
            for ours, theirs in zip(batched, steps, strict=True):
                assert relative_rms_error(ours[index:index + 1], theirs) < tolerance, index
        with pytest.raises(ValueError, match="a padded batch's state .its rows at different positions. goes on one "
                                             "token at a time"):
            model.prefill(following, state)


@pytest.mark.parametrize("case", CASES)
def test_a_packed_batch_gives_each_document_what_it_gets_alone(case: str) -> None:
    """Documents of lengths 1, 2, 63, 64, 65 and 301 packed in one row (``position_ids``): in every
    form each document's logits are those it gets alone (in the parallel form; fp64: to round-off,
    or to MCSD's fp32 constants); in the training form the gradients of a loss over the packed row are the sum of
    each document's alone; the state after the row is the last document's, which decodes on as
    it does. A row whose only start is its first token is the joined row, and a block of one token
    is that token alone. An architecture that cannot keep documents apart yet refuses them in one line."""
    architecture = registry.get(case.split("/")[0])
    model = tiny_model(case, chunk_size=16).double()
    position_ids = document_position_ids(DOCUMENT_LENGTHS)
    input_ids = torch.randint(0, 101, position_ids.shape)
    if not model.separates_documents:
        with pytest.raises(mcsd.ConfigError, match="cannot keep the documents of a packed batch apart yet: use "
                                                   "data.documents=joined"):
            model(input_ids, position_ids=position_ids)
        return
    tolerance = 1e-6 if architecture.fp32_constants else 1e-12
    documents = input_ids.split(DOCUMENT_LENGTHS, dim=1)
    with torch.no_grad():  # each document alone in the reference form (the forms agree: tests above)
        alone = torch.cat([model(document, form="parallel") for document in documents], dim=1)
        one_document = torch.arange(input_ids.shape[1])[None]  # a start at position 0 only: the joined row
        joined = model(input_ids, form="parallel")
        for form in architecture.forms:
            assert relative_rms_error(model(input_ids, form=form, position_ids=position_ids), alone) < tolerance, form
            assert relative_rms_error(model(input_ids, form=form, position_ids=one_document), joined) < tolerance, form
            one_token = model(input_ids[:, :1], form=form, position_ids=one_document[:, :1])  # a block of one token
            assert relative_rms_error(one_token, alone[:, :1]) < tolerance, form
        _, state = model.prefill(input_ids, position_ids=position_ids)
        _, alone_state = model.prefill(documents[-1])
        next_token = torch.tensor([7])
        assert relative_rms_error(model.step(next_token, state)[0], model.step(next_token, alone_state)[0]) < tolerance
    weights = torch.randn(*input_ids.shape, 101, dtype=torch.float64)
    (model(input_ids, position_ids=position_ids) * weights).sum().backward()
    packed_gradients = [parameter.grad.clone() for parameter in model.parameters()]
    model.zero_grad()
    sum((model(document) * part).sum() for document, part in zip(documents, weights.split(DOCUMENT_LENGTHS, dim=1))
        ).backward()
    for (name, parameter), gradient in zip(model.named_parameters(), packed_gradients):
        same = torch.equal(gradient, parameter.grad)  # all zero, too (the dynamic mask's at A = 0)
        assert same or relative_rms_error(gradient, parameter.grad) < tolerance, name
