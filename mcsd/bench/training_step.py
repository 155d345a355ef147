"""A training benchmark point (``mcsd-bench mode=train``): forward, backward and an AdamW step on
random tokens in one form of the model, its documents joined or apart; its times, memory and
FLOPs (the model's count and the one the code executes).
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from mcsd.bench.load import SPREAD_LIMIT, spread
from mcsd.bench.measure import build, compiled_graphs, no_eager_fallback, peak_memory_bytes, timed, weights_bytes
from mcsd.models.build import build_model
from mcsd.models.config import LMConfig
from mcsd.models.modeling import CausalLM
from mcsd.precision import DTYPES, Precision


def counted_training_flops(model: CausalLM, batch_size: int, seq_len: int, form: str) -> int:
    """``torch.utils.flop_counter.FlopCounterMode``'s count of one training step (forward and
    backward of the loss) of ``model`` in ``form``: the products the code executes (chunk
    padding and carries included), run on a copy of the model on the meta device,
    so that it costs no time at any length and attention is counted through its math form (the
    counter has no formula for the CPU flash kernel). Elementwise work is not counted."""
    with torch.device("meta"):
        meta = build_model(model.config)
    ids = torch.zeros(batch_size, seq_len + 1, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        loss, _ = meta.loss(ids[:, :-1], ids[:, 1:], form=form)
        loss.backward()
    return counter.get_total_flops()


DOCUMENT_TOKENS = 512  # the documents' mean length apart, by default (mcsd-bench's train.document_tokens)


def document_positions(batch_size: int, seq_len: int, mean_tokens: float, generator: torch.Generator) -> torch.Tensor:
    """Each token's position in its own document ``[batch_size, seq_len]``, for sequences packed
    with documents whose lengths are drawn from an exponential distribution of mean
    ``mean_tokens`` (at least one token each; the last one cut at the sequence's end): what
    ``data.documents=apart`` gives a model, with boundaries at seeded places."""
    positions = torch.empty(batch_size, seq_len, dtype=torch.long)
    for row in positions:
        start = 0
        while start < seq_len:
            length = max(1, round(float(torch.empty(1).exponential_(1 / mean_tokens, generator=generator))))
            end = min(start + length, seq_len)
            row[start:end] = torch.arange(end - start)
            start = end
    return positions


def train_point(
    model_cfg: LMConfig | dict[str, Any] | str, form: str, batch_size: int, seq_len: int, repeats: int, warmup: int, device: str,
    dtype: str, seed: int, compile: bool = False, activation_checkpointing: bool = False, kernels: str = "auto",
    documents: str = "joined", document_tokens: int = DOCUMENT_TOKENS,
) -> dict[str, Any]:
    """Tokens/s and peak memory of forward + backward + AdamW step in one form; with ``compile``
    through the compiled loss that training uses (:meth:`CausalLM.loss_function`; compiled by the
    warm-up, which then runs at least once: ``first_step_s`` is its first step, compiling
    included); with ``activation_checkpointing`` each layer keeps only its input for the backward
    (the model FLOPs do not count the recomputation). ``kernels``: ``model.kernels`` of the point
    (the FLOPs counted are the same either way). ``documents``: ``joined``, or ``apart``: each
    sequence packed with documents of ``document_tokens`` tokens on average
    (:func:`document_positions`), none of which sees another (``data.documents=apart``)."""
    device_, precision = torch.device(device), Precision.mixed(DTYPES[dtype])  # as mcsd-train trains
    model = build(model_cfg, device_, precision.weights, seed).train()
    model.use_kernels(kernels)
    for layer in model.layers:
        layer.activation_checkpointing = activation_checkpointing
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch_size, seq_len + 1), generator=generator).to(device_)
    position_ids = (document_positions(batch_size, seq_len, document_tokens, generator).to(device_)
                    if documents == "apart" else None)

    loss_function = model.loss_function(compile)

    def step() -> None:
        with precision.autocast(device_):
            loss, _ = loss_function(ids[:, :-1], ids[:, 1:], form=form, position_ids=position_ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    graphs = compiled_graphs()
    with no_eager_fallback(compile):
        warmups = [timed(step, device_)[0] for _ in range(max(warmup, 1 if compile else 0))]
        if device_.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device_)
        steps = [timed(step, device_)[0] for _ in range(repeats)]
    step_s = statistics.median(steps)
    peak = peak_memory_bytes(device_)
    weights = weights_bytes(model)
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "precision": precision.name,
        "model_flops": model.training_flops(batch_size, seq_len, form),
        "counted_flops": counted_training_flops(model, batch_size, seq_len, form),
        "step_s": step_s,
        "step_s_min": min(steps),
        "step_s_max": max(steps),
        "unsteady": spread(steps) > SPREAD_LIMIT,
        "threads": torch.get_num_threads(),
        "first_step_s": warmups[0] if warmups else None,  # compiling included, with ``compile``
        "tokens_per_s": batch_size * seq_len / step_s,
        "peak_mem_bytes": peak,
        "weights_bytes": weights,
        "peak_mem_minus_weights_bytes": peak - weights,
        "compiled": compile and compiled_graphs() > graphs,  # its own graphs, no eager fallback
    }
