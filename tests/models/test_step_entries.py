"""``CausalLM.step_entries``, the step an ONNX export traces (:mod:`mcsd.deploy.onnx`), in PyTorch
alone (no ONNX package needed): its KV caches read and not written, each returning the token's
entries, which the caller writes at the position as the export's runner does; its logits are
the eager step's, in fp64 and in 16 bits."""

from __future__ import annotations

import pytest
import torch
from helpers.models import (
    ONE_LAYER_OF_EACH_KIND,
    SIXTEEN_BIT_TOLERANCE,
    assert_recurrent_states_stay_fp32,
    decode_all,
    relative_rms_error,
    tiny_model,
)

from mcsd.deploy.onnx import prefilled, read_only_caches
from mcsd.models import CausalLM, DecodingState, registry
from mcsd.ops.attention import KVCache
from mcsd.models.modules.state import LayerState, tensors_of

PROMPT, LENGTH = 3, 20


def decode_by_entries(model: CausalLM, input_ids: torch.Tensor) -> tuple[torch.Tensor, list[LayerState]]:
    """The prompt ``input_ids[:, :PROMPT]`` into caches of ``LENGTH`` positions (zeros past it, as
    the export's prefill), then one :meth:`CausalLM.step_entries` per token, each KV cache's entries
    written at the position into the cache given, every other state replaced by the one returned:
    the logits of positions PROMPT-1.. and the last state."""
    with torch.no_grad():
        logits, layers = prefilled(model, input_ids[:, :PROMPT], LENGTH)
        outputs = [logits]
        for position in range(PROMPT, input_ids.shape[1]):
            given = read_only_caches(layers)
            logits, advanced = model.step_entries(input_ids[:, position], given, torch.tensor(position))
            outputs.append(logits)
            kept = []
            for old, new in zip(layers, advanced):
                parts = []
                for old_part, new_part in zip(old, new):
                    if isinstance(old_part, KVCache):
                        entries = tensors_of(new_part)
                        assert all(entry.shape[2] == 1 for entry in entries)
                        for cache, entry in zip(tensors_of(old_part), entries):
                            cache[:, :, position] = entry[:, :, 0]
                        parts.append(old_part)
                    else:
                        parts.append(new_part)
                kept.append(LayerState(*parts))
            layers = kept
    return torch.stack(outputs, dim=1), layers


@pytest.mark.parametrize("name", registry.architectures())
def test_the_step_on_read_only_caches_equals_the_eager_step(name: str) -> None:
    """fp64, every architecture (a layer of each kind): the logits along a 17-token path equal the
    eager step's, and the KV caches the entries were written into are the eager step's caches."""
    model = tiny_model(name, **ONE_LAYER_OF_EACH_KIND.get(name, {})).double()
    input_ids = torch.randint(0, model.config.vocab_size, (2, LENGTH), generator=torch.Generator().manual_seed(1))
    logits, layers = decode_by_entries(model, input_ids)
    torch.testing.assert_close(logits, decode_all(model, input_ids, split=PROMPT), rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        _, eager = model.prefill(input_ids[:, :PROMPT], max_new_tokens=LENGTH - PROMPT)
        for position in range(PROMPT, LENGTH - 1):
            _, eager = model.step(input_ids[:, position], eager)
    for ours, theirs in zip(layers, eager.layers):
        for part, eager_part in zip(ours, theirs):
            if isinstance(part, KVCache):  # positions up to the last written: LENGTH - 1
                for mine, reference in zip(tensors_of(part), tensors_of(eager_part)):
                    torch.testing.assert_close(mine[:, :, :LENGTH - 1], reference[:, :, :LENGTH - 1],
                                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", registry.architectures())
def test_the_step_on_read_only_caches_of_a_16_bit_model(name: str, dtype: torch.dtype) -> None:
    """A model cast to 16 bits decodes through it as close to its fp32 self as its eager step does,
    its KV caches' entries in the model's dtype and its recurrent states in fp32."""
    model = tiny_model(name, **ONE_LAYER_OF_EACH_KIND.get(name, {}))
    input_ids = torch.randint(0, model.config.vocab_size, (2, LENGTH), generator=torch.Generator().manual_seed(2))
    reference = decode_all(model, input_ids, split=PROMPT)
    model = model.to(dtype)
    logits, layers = decode_by_entries(model, input_ids)
    assert logits.dtype == dtype
    assert relative_rms_error(logits, reference) < SIXTEEN_BIT_TOLERANCE[dtype]
    assert_recurrent_states_stay_fp32(model, DecodingState(position=LENGTH, layers=layers))
    caches = [part for layer in layers for part in layer if isinstance(part, KVCache)]
    assert all(tensor.dtype == dtype for cache in caches for tensor in tensors_of(cache))
