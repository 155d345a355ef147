"""A decoding benchmark point (``mcsd-bench mode=inference``): prefill a random prompt, then
decode greedily one token per step through the model's recurrent state (MCSD) or KV cache
(attention), eagerly, compiled, replayed as CUDA graphs or by ONNX Runtime; its times, memory and
the bytes a step reads.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from mcsd.bench.load import SPREAD_LIMIT, spread
from mcsd.bench.measure import build, compiled_graphs, no_eager_fallback, peak_memory_bytes, timed, weights_bytes
from mcsd.deploy.quantize import quantize_weights, stored_bytes, weights_dtype
from mcsd.models.config import LMConfig
from mcsd.models.modeling import CausalLM
from mcsd.models.modules.state import CapacityState, parts_of, tensors_of
from mcsd.models.cuda_graphs import StaticStep, capacity_bucket
from mcsd.precision import DTYPES, Precision


def state_bytes(state: Any, kv_positions: float | None = None) -> int | float:
    """Bytes of every tensor a decoding state holds (a KV cache's whole allocation); with
    ``kv_positions``, of each KV cache only its first ``kv_positions`` entries (what a decoding
    step reads there; the rest of its allocation is not read)."""
    total: int | float = 0
    for part in parts_of(state):
        size = sum(tensor.numel() * tensor.element_size() for tensor in tensors_of(part))
        total += size * kv_positions / part.capacity if kv_positions is not None and isinstance(part, CapacityState) else size
    return total


def kv_positions_read(step: Any, batch_size: int, prompt_len: int, length: int) -> float:
    """The KV-cache positions an average decoding step reads: the eager step at position ``p``
    reads its ``p + 1``; a step recorded at fixed addresses (:class:`StaticStep`) attends over its
    whole capacity bucket, up to twice that, and reads all of it."""
    if not isinstance(step, StaticStep) or batch_size not in step.buffers or not step.buffers[batch_size].capacity:
        return prompt_len + (length + 1) / 2
    capacity = step.buffers[batch_size].capacity
    return statistics.fmean(min(capacity_bucket(position + 1, step.min_capacity), capacity)
                            for position in range(prompt_len, prompt_len + length))


def inference_point(
    model_cfg: LMConfig | dict[str, Any] | str, batch_size: int, prompt_len: int, gen_len: int, repeats: int, warmup: int,
    device: str, dtype: str, seed: int, compile: bool = False, cuda_graphs: bool = False, kernels: str = "auto",
    weights: str = "full", runtime: str = "torch",
) -> dict[str, Any]:
    """Median prefill time, decode time per token, latency, throughput, peak memory, the
    bytes of one sequence's decoding state after ``prompt_len + gen_len`` tokens, and the bytes
    a decoding step must read at least (the weights it uses, the states of its batch); with
    ``compile`` through the compiled step (compiled by the warm-up, which then runs at least
    once: ``graphs_compiled_timed`` counts what dynamo compiled while timed, 0 when every step
    ran a graph compiled before); with ``cuda_graphs`` through the step replayed as CUDA graphs
    (:meth:`CausalLM.decoding`), recorded by a warm-up over the whole length (every KV-cache
    bucket), which then runs at least once: ``graphs_recorded_timed`` counts the recordings
    made while timed (0 when every step replayed). ``kernels``: ``model.kernels`` of the point.
    ``weights``: the linear layers' weight format (:mod:`mcsd.deploy.quantize`; int4, and int8 on
    a CPU, run the model in bfloat16, their kernels' activations, whatever ``dtype`` says). ``runtime=onnx``: the
    model exported to ONNX (:mod:`mcsd.deploy.onnx`, KV caches of ``prompt_len + gen_len``
    positions) and decoded by ONNX Runtime on the CPU (:func:`onnx_decoding`); its ``weights``
    quantize the graphs (ONNX Runtime's MatMulNBits, activations in ``dtype``)."""
    if runtime == "onnx":  # the model's full weights exported, the graphs quantized by ONNX Runtime
        model = build(model_cfg, torch.device(device), DTYPES[dtype], seed).eval()
        return onnx_decoding(model, batch_size, prompt_len, gen_len, repeats, warmup, seed, weights)
    device_, dtype_ = torch.device(device), weights_dtype(weights, DTYPES[dtype], device)
    model = quantize_weights(build(model_cfg, device_, dtype_, seed).eval(), weights)
    model.use_kernels(kernels)
    prefill, step = model.decoding(compile, cuda_graphs)
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.config.vocab_size, (batch_size, prompt_len), generator=generator).to(device_)

    @torch.inference_mode()
    def run(length: int) -> tuple[float, float, float, float]:
        """Prefill and decode seconds; bytes of a sequence's state at the end, and of what an
        average step reads of it (a KV cache's positions so far: the step at position p reads
        p + 1 of them, prompt_len + (length + 1) / 2 on average)."""
        prefill_s, (logits, state) = timed(lambda: prefill(prompt, max_new_tokens=length), device_)

        def decode() -> Any:
            next_logits, next_state = logits, state
            for _ in range(length):
                next_logits, next_state = step(next_logits.argmax(-1), next_state)
            return next_state

        decode_s, final_state = timed(decode, device_)
        return (prefill_s, decode_s, state_bytes(final_state) / batch_size,
                state_bytes(final_state, kv_positions=kv_positions_read(step, batch_size, prompt_len, length))
                / batch_size)

    graphs = compiled_graphs()
    with no_eager_fallback(compile):
        for _ in range(max(warmup, 1 if compile or cuda_graphs else 0)):
            run(gen_len if cuda_graphs else min(gen_len, 16))
        recorded, warmed = getattr(step, "recorded", 0), compiled_graphs()
        if device_.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device_)
        runs = [run(gen_len) for _ in range(repeats)]
    return {
        **decoding_numbers(model, runs, batch_size, gen_len, peak_memory_bytes(device_)),
        "compiled": compile and warmed > graphs,  # its own graphs, no eager fallback
        "graphs_compiled_timed": compiled_graphs() - warmed,
        "cuda_graphs": cuda_graphs,
        "graphs_recorded_timed": getattr(step, "recorded", 0) - recorded,
    }


def decoding_numbers(model: CausalLM, runs: list[tuple[float, float, float, float]], batch_size: int, gen_len: int,
                     peak: int, stored: tuple[int, int] | None = None) -> dict[str, Any]:
    """An inference point's numbers from its timed ``runs`` (prefill seconds, decode seconds, a
    sequence's state bytes, the state bytes a step reads per sequence) and its peak memory;
    ``stored``: the weights' bytes and those a step reads, where another runtime holds them
    (an ONNX graph's), instead of the model's."""
    decode_per_token = [r[1] / gen_len for r in runs]
    latency_s = statistics.median(r[0] + r[1] for r in runs)
    # What one decoding step must read at least: every weight but the input embedding's (a
    # lookup of B rows) unless it is tied to the LM head, and each sequence's state.
    weights, step_weights = stored or (weights_bytes(model), step_weight_bytes(model))
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "dtype": str(model.embed.weight.dtype).removeprefix("torch."),  # int4, and int8 on a CPU: bfloat16
        "precision": Precision.cast(model.embed.weight.dtype).name,  # the model cast to its dtype
        "prefill_s": statistics.median(r[0] for r in runs),
        "decode_s_per_token": statistics.median(r[1] for r in runs) / gen_len,
        "decode_s_per_token_min": min(decode_per_token),
        "decode_s_per_token_max": max(decode_per_token),
        "unsteady": spread(decode_per_token) > SPREAD_LIMIT,
        "threads": torch.get_num_threads(),
        "latency_s": latency_s,
        "tokens_per_s": batch_size * gen_len / latency_s,
        "peak_mem_bytes": peak,
        "weights_bytes": weights,
        "peak_mem_minus_weights_bytes": peak - weights,
        "state_bytes_per_sequence": int(runs[-1][2]),
        "step_weight_bytes": step_weights,
        "step_state_bytes_per_sequence": runs[-1][3],
        "step_read_bytes": step_weights + batch_size * runs[-1][3],
    }


def onnx_decoding(model: CausalLM, batch_size: int, prompt_len: int, gen_len: int, repeats: int, warmup: int,
                  seed: int, weights: str = "full") -> dict[str, Any]:
    """:func:`inference_point`'s numbers for ``model`` (full weights) exported to ONNX with
    ``weights`` (in a temporary folder, not timed) and decoded greedily by
    :class:`~mcsd.deploy.onnx_runner.OnnxDecoder` on torch's thread count: the same prompt,
    lengths and repeats, the state the graphs carry, the weight bytes the step graph holds."""
    import tempfile
    from pathlib import Path

    from mcsd.deploy.onnx import STEP_FILE, graph_weight_bytes, write_onnx_export
    from mcsd.deploy.onnx_runner import OnnxDecoder

    cpu = torch.device("cpu")
    with tempfile.TemporaryDirectory(prefix="mcsd-bench-onnx-") as folder:
        write_onnx_export(model, Path(folder), prompt_len + gen_len, None, weights=weights)
        stored = graph_weight_bytes(Path(folder) / STEP_FILE)
        decoder = OnnxDecoder(folder, threads=torch.get_num_threads())
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.config.vocab_size, (batch_size, prompt_len), generator=generator).numpy()

    def run(length: int) -> tuple[float, float, float, float]:
        prefill_s, (logits, state) = timed(lambda: decoder.prefill(prompt), cpu)

        def decode() -> Any:
            next_logits, next_state = logits, state
            for _ in range(length):
                next_logits, next_state = decoder.step(next_logits.argmax(-1), next_state)
            return next_state

        decode_s, (_, arrays) = timed(decode, cpu)
        # The exported step attends over its KV caches' whole capacity (masked after the position):
        # it reads every byte of the state, as the step at fixed addresses does.
        whole = sum(array.nbytes for array in arrays) / batch_size
        return prefill_s, decode_s, whole, whole

    for _ in range(warmup):
        run(min(gen_len, 16))
    runs = [run(gen_len) for _ in range(repeats)]
    return {
        **decoding_numbers(model, runs, batch_size, gen_len, peak_memory_bytes(cpu), stored),
        "compiled": False, "cuda_graphs": False, "graphs_compiled_timed": 0, "graphs_recorded_timed": 0,
    }


def step_weight_bytes(model: CausalLM) -> int:
    """The bytes of the weights a decoding step reads in full, as stored: all but the input
    embedding (of which it reads one row), unless the LM head reads it too (tied; a quantized
    head is a copy of its own)."""
    read_embedding = model.lm_head.weight is model.embed.weight
    return sum(stored_bytes(param) for param in model.parameters() if read_embedding or param is not model.embed.weight)
