"""The decoding step at fixed addresses (what CUDA graphs replay) against the eager step, on the
CPU: ``record="call"`` runs the same path as ``record="cuda"`` (position as a device tensor,
buffers allocated once per capacity bucket, warm-up and its undoing, one recording per bucket)
with each replay a call. The CUDA graphs themselves are checked in ``test_gpu.py``."""

from __future__ import annotations

import pytest
import torch
from helpers.models import (
    SIXTEEN_BIT_TOLERANCE,
    assert_recurrent_states_stay_fp32,
    decode_all,
    relative_rms_error,
    tiny_model,
    tiny_model_to_compile,
    variant_cases,
)

from mcsd.models import CausalLM, ConfigError, DecodingState, registry
from mcsd.models.modules.state import CapacityState, tensors_of
from mcsd.models.cuda_graphs import StaticStep, capacity_bucket
from mcsd.models.modules.state import parts_of

PROMPT, LENGTH = 3, 23  # 20 steps, at positions 3..22: KV-cache buckets 4, 8, 16 and 32 with min_capacity=4


def has_kv_cache(model: CausalLM) -> bool:
    return any(layer.mixer.state_rewinds for layer in model.layers)


def static_decode(step: StaticStep, model: CausalLM, input_ids: torch.Tensor, hint: bool = False,
                  through_step: bool = True) -> tuple[torch.Tensor, DecodingState]:
    """Prefill ``input_ids[:, :PROMPT]`` (through the step's prefill, or the model's) and step through
    the rest: the logits of positions PROMPT-1.. and the state after them."""
    new = input_ids.shape[1] - PROMPT if hint else 0
    prefill = step.prefill if through_step else model.prefill
    logits, state = prefill(input_ids[:, :PROMPT], max_new_tokens=new)
    outputs = [logits]
    for position in range(PROMPT, input_ids.shape[1]):
        logits, state = step(input_ids[:, position].clone(), state)
        outputs.append(logits)
    return torch.stack(outputs, dim=1), state


def test_capacity_buckets_are_powers_of_two_from_the_minimum() -> None:
    assert [capacity_bucket(n, 4) for n in (1, 4, 5, 8, 9, 23)] == [4, 4, 8, 8, 16, 32]
    assert capacity_bucket(129, 256) == 256 and capacity_bucket(8321, 256) == 16384


@pytest.mark.parametrize("case", variant_cases())
def test_the_static_step_equals_the_eager_step(case: str) -> None:
    """fp64, every variant: a sequence that outgrows its KV caches three times (recorded at each
    bucket, its buffers allocated again), then two more sequences through the step's prefill (the
    buffers reused: the second records the smaller buckets on the new buffers, the third nothing);
    each one's logits equal the eager step's, and the state it leaves continues eagerly as the
    eager state does. A recurrent model records once."""
    model = tiny_model(case).double()
    step = StaticStep(model, record="call", min_capacity=4)
    cached = has_kv_cache(model)
    for sequence, (through_step, recordings) in enumerate([(False, 4 if cached else 1), (True, 3 if cached else 0),
                                                            (True, 0)]):
        input_ids = torch.randint(0, model.config.vocab_size, (2, LENGTH + 1))
        expected, eager_state = decode_with_state_of(model, input_ids[:, :LENGTH])
        before = step.recorded, step.replayed
        logits, state = static_decode(step, model, input_ids[:, :LENGTH], through_step=through_step)
        torch.testing.assert_close(logits, expected, rtol=1e-12, atol=1e-12, msg=f"sequence {sequence}")
        assert (step.recorded - before[0], step.replayed - before[1]) == (recordings, LENGTH - PROMPT)
        assert state.position == eager_state.position == LENGTH
        next_ids = input_ids[:, LENGTH].clone()
        torch.testing.assert_close(model.step(next_ids, state)[0], model.step(next_ids, eager_state)[0],
                                   rtol=1e-12, atol=1e-12)


def decode_with_state_of(model: CausalLM, input_ids: torch.Tensor) -> tuple[torch.Tensor, DecodingState]:
    """The eager step's logits and final state (prefill not told the length: its caches grow)."""
    logits, state = model.prefill(input_ids[:, :PROMPT])
    outputs = [logits]
    for position in range(PROMPT, input_ids.shape[1]):
        logits, state = model.step(input_ids[:, position].clone(), state)
        outputs.append(logits)
    return torch.stack(outputs, dim=1), state


@pytest.mark.parametrize("name", registry.architectures())
def test_kv_cache_positions_never_written_do_not_reach_the_logits(name: str) -> None:
    """Prefill told the length preallocates its caches (``torch.empty``): the step takes them over,
    zeroing what is not written yet, which the masked attention over the whole capacity then
    multiplies by 0 (a NaN there would spread)."""
    model = tiny_model(name, attention_every=2) if name == "wonderful_matrices" else tiny_model(name)
    input_ids = torch.randint(0, model.config.vocab_size, (2, LENGTH))
    expected = decode_all(model, input_ids, split=PROMPT)
    logits, state = model.prefill(input_ids[:, :PROMPT], max_new_tokens=LENGTH - PROMPT)
    caches = [part for layer_state in state.layers for part in (layer_state.mixer, layer_state.mlp)
              if isinstance(part, CapacityState)]
    assert bool(caches) == has_kv_cache(model)
    for cache in caches:
        for tensor in tensors_of(cache):
            tensor[:, :, PROMPT:] = float("nan")
    step = StaticStep(model, record="call", min_capacity=4)
    outputs = [logits]
    for position in range(PROMPT, LENGTH):
        logits, state = step(input_ids[:, position].clone(), state)
        outputs.append(logits)
    torch.testing.assert_close(torch.stack(outputs, dim=1), expected, rtol=1e-5, atol=1e-5)
    if caches:  # one allocation, the prefill's own (capacity 20 + 3): buckets 4, 8, 16 and the whole 23
        assert step.recorded == 4 and {buffers.capacity for buffers in step.buffers.values()} == {LENGTH}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", registry.architectures())
def test_the_static_step_of_a_16_bit_model(name: str, dtype: torch.dtype) -> None:
    """A model cast to 16 bits decodes through the static step as close to its fp32 self as its eager
    step is, its recurrent states in fp32."""
    model = tiny_model(name)
    input_ids = torch.randint(0, model.config.vocab_size, (2, LENGTH))
    reference = decode_all(model, input_ids, split=PROMPT)
    model = model.to(dtype)
    logits, state = static_decode(StaticStep(model, record="call", min_capacity=4), model, input_ids)
    assert logits.dtype == dtype
    assert relative_rms_error(logits, reference) < SIXTEEN_BIT_TOLERANCE[dtype]
    assert_recurrent_states_stay_fp32(model, state)


@pytest.mark.parametrize("name", registry.architectures())
def test_a_compiled_static_step_equals_the_eager_step(name: str) -> None:
    """``compile=True``: the static step through ``torch.compile`` (what CUDA graphs record on a GPU
    with ``compile``), across KV-cache buckets; its logits equal the eager step's to float rounding.
    Traced by dynamo and AOTAutograd (tests/conftest.py): the static step is a GPU's path,
    where inductor compiles it (test_gpu.py's CUDA-graph decoding, compiled)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = tiny_model_to_compile(name)
    input_ids = torch.randint(0, model.config.vocab_size, (2, LENGTH))
    step = StaticStep(model, compile=True, record="call", min_capacity=4)
    logits, _ = static_decode(step, model, input_ids)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it was traced
    torch.testing.assert_close(logits, decode_all(model, input_ids, split=PROMPT, hint=False), rtol=1e-5, atol=1e-5)


def test_the_static_step_needs_a_prefilled_state_and_cuda_graphs_a_gpu() -> None:
    model = tiny_model("mcsd")  # its fresh state has no section states yet (a KV cache would do)
    with pytest.raises(ValueError, match="prefill the prompt first"):
        StaticStep(model, record="call")(torch.zeros(1, dtype=torch.long), model.init_state(1, 4))
    with pytest.raises(ConfigError, match="cuda_graphs=true needs a model on a CUDA device .* set cuda_graphs=false"):
        model.decoding(cuda_graphs=True)
    with pytest.raises(ValueError, match="record='cuda' needs a model on a CUDA device"):
        StaticStep(model)


@pytest.mark.parametrize("case", ["mcsd/full", "transformer/default"])
def test_an_error_while_recording_leaves_the_step_as_it_was(case: str) -> None:
    """An error inside a recording (here in its second warm-up step, after the first has moved the
    recurrent states on) is raised as itself; the states are put back and nothing is kept of the
    recording, so that the next call records anew and decodes exactly as the eager step does (on
    a GPU the capture is ended and dropped too: an in-process grid goes on to its next point)."""
    model = tiny_model(case).double()
    step = StaticStep(model, record="call", min_capacity=4)
    input_ids = torch.randint(0, model.config.vocab_size, (2, LENGTH))
    expected, _ = decode_with_state_of(model, input_ids)
    run, calls = step.run, []

    def failing(*arguments: object) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected failure in the recording")
        return run(*arguments)

    step.run = failing
    logits, state = step.prefill(input_ids[:, :PROMPT])
    with pytest.raises(RuntimeError, match="injected failure in the recording"):
        step(input_ids[:, PROMPT].clone(), state)
    assert step.recorded == 0 and len(calls) == 2
    buffers = step.buffers[2]
    assert not buffers.recordings
    given = [part for part in parts_of(state.layers) if isinstance(part, torch.Tensor)]  # as recurrent_tensors
    assert len(given) == len(buffers.recurrent_tensors())
    for kept, value in zip(buffers.recurrent_tensors(), given):
        assert torch.equal(kept, value)  # put back after the warm-up step that ran
    outputs = [logits]
    for position in range(PROMPT, LENGTH):
        logits, state = step(input_ids[:, position].clone(), state)
        outputs.append(logits)
    torch.testing.assert_close(torch.stack(outputs, dim=1), expected, rtol=1e-12, atol=1e-12)
