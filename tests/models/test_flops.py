"""Model FLOPs (``CausalLM.training_flops``) against ``FlopCounterMode``'s count of the executed step."""

from __future__ import annotations

import pytest
import torch
from helpers.models import tiny_config
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import mcsd
from mcsd.bench.training_step import counted_training_flops
from mcsd.models import TokenMixer, registry
from mcsd.models.modules.attention import CausalSelfAttention
from mcsd.ops.flops import attention_flops, decayed_attention_flops, exp_filter_flops, over_chunks, wkv_flops


@pytest.mark.parametrize("length", [64, 100])
def test_transformer_model_flops_are_causal_and_the_flop_counters_count_palms(length: int) -> None:
    """The Transformer's parallel form: 6 FLOPs per weight and token plus causal attention's
    6 L d (N + 1) per token (the keys up to each query: half of PaLM's appendix B 12 L d N, which
    counts the masked half that the fused causal kernels skip); ``FlopCounterMode`` counts PaLM's,
    of the step on the meta device and (at one length) of the step executed on the CPU through
    the math attention."""
    model = mcsd.build_model(tiny_config("transformer"))
    batch, config = 2, model.config
    weights = sum(module.weight.numel() for module in model.modules() if isinstance(module, nn.Linear))
    causal = 6 * weights * batch * length + 6 * config.num_layers * config.hidden_size * (length + 1) * batch * length
    palm = 6 * weights * batch * length + 12 * config.num_layers * config.hidden_size * length * batch * length
    assert model.training_flops(batch, length, "parallel") == causal
    assert counted_training_flops(model, batch, length, "parallel") == palm
    if length == 64:
        ids = torch.randint(0, config.vocab_size, (batch, length + 1))
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            loss, _ = model.loss(ids[:, :-1], ids[:, 1:], form="parallel")
            loss.backward()
        assert counter.get_total_flops() == palm


@pytest.mark.parametrize("name", registry.architectures())
def test_model_flops_are_what_the_training_form_executes(name: str) -> None:
    """Within 6% of ``FlopCounterMode``'s count at 4 chunks, once the sums that run elementwise
    (``sequence_products = False``: the counter does not see them) are set aside. The rest is
    what the code adds to the model's work: the chunk carries' ``[nc, nc]`` products and the
    final states' products (at lengths that are not a multiple of the chunk, its padding too)."""
    model = mcsd.build_model(tiny_config(name))
    form, batch, length = registry.get(name).train_form, 2, 4 * model.config.chunk_size
    mixers = [module for module in model.modules() if isinstance(module, TokenMixer)]
    unseen = sum(batch * mixer.sequence_flops(length, model.context(form)) * (1 + mixer.sequence_backward_factor)
                 for mixer in mixers if not mixer.sequence_products) * model.streams.count
    # The counter counts a causal SDPA call's masked half too (the parallel form's, which the model FLOPs leave out).
    masked = sum(batch * 3 * (2 * length * length - length * (length + 1)) * 2 * mixer.num_heads * mixer.head_width
                 for mixer in mixers if isinstance(mixer, CausalSelfAttention) and form == "parallel")
    expected = model.training_flops(batch, length, form) - unseen + masked
    counted = counted_training_flops(model, batch, length, form)
    assert abs(counted / expected - 1) < 0.06, (counted, expected)


def test_the_ops_flops_by_form() -> None:
    # Attention: full N x N in parallel (as SDPA counts it), keys up to each block's end otherwise.
    assert attention_flops(10, 4, 6, "parallel", 4) == 2 * 55 * 10  # causal: 55 query-key terms
    assert attention_flops(10, 4, 6, "chunk", 4) == 2 * (4 * 4 + 4 * 8 + 2 * 10) * 10
    assert attention_flops(3, 4, 6, "recurrent", 4) == 2 * (1 + 2 + 3) * 10
    # Decayed attention and the exponential filter: L x L inside chunks (the last one r x r).
    # (chunk s: 2 s^2 (dk + dv) + 4 s dk dv; dk = 2, dv = 3)
    assert decayed_attention_flops(10, 2, 3, "chunk", 4) == 2 * (10 * 16 + 24 * 4) + (10 * 4 + 24 * 2)
    assert decayed_attention_flops(10, 2, 3, "recurrent", 4) == 10 * 4 * 2 * 3
    assert exp_filter_flops(10, 3, "chunk", 4) == 2 * (2 * 16 + 16) * 3 + (2 * 4 + 8) * 3
    assert exp_filter_flops(10, 3, "parallel", 4) == 2 * 100 * 3 and exp_filter_flops(10, 3, "recurrent", 4) == 60
    assert wkv_flops(4, 3, "chunk", 4) == 4 * (4 * 5 + 4) * 3 and wkv_flops(4, 3, "parallel", 4) == 4 * 4 * 5 * 3
    assert over_chunks(9, 4, lambda size: size**2) == 16 + 16 + 1
    with pytest.raises(ValueError, match="form='chunked' is unknown"):
        exp_filter_flops(4, 3, "chunked", 4)
