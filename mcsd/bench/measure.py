"""Measurements of one benchmark point, run inside a fresh process (CPU) or in place (GPU).

Inference: prefill a random prompt, then decode greedily one token per step through the
model's recurrent state (MCSD) or KV cache (attention). Training: forward,
backward and an AdamW step on random tokens in one form of the model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import resource
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._dynamo.utils import counters
from torch.utils.flop_counter import FlopCounterMode

from mcsd.bench.load import SPREAD_LIMIT, spread
from mcsd.checkpoint.saved_model import load
from mcsd.deploy.quantize import quantize_weights, stored_bytes, weights_dtype
from mcsd.models.build import build_model
from mcsd.models.modeling import CausalLM
from mcsd.models.modules.attention import KVCache
from mcsd.models.cuda_graphs import StaticStep, capacity_bucket
from mcsd.precision import DTYPES


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(function: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """Seconds ``function`` takes (after the device has finished), and its result."""
    synchronize(device)
    start = time.perf_counter()
    result = function()
    synchronize(device)
    return time.perf_counter() - start, result


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated device memory (GPU) or peak resident memory of this process (CPU).

    On Linux the CPU peak is ``VmHWM`` of ``/proc/self/status``, the high-water mark of this
    process's own address space: ``getrusage``'s ``ru_maxrss`` would carry over the peak of the
    parent that started it (Linux keeps it across fork and exec), so a point's process would
    report its launcher's memory.
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def limit_extra_memory(megabytes: float | None) -> None:
    """Cap what this process may allocate beyond what it holds now (simulates a smaller
    machine: a bigger allocation fails as out of memory)."""
    if megabytes is None:
        return
    with open("/proc/self/statm") as handle:
        virtual_bytes = int(handle.read().split()[0]) * resource.getpagesize()
    limit = virtual_bytes + int(megabytes * 2**20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def state_bytes(state: Any, kv_positions: float | None = None) -> int | float:
    """Bytes of every tensor a decoding state holds (a KV cache's whole allocation); with
    ``kv_positions``, of each KV cache only its first ``kv_positions`` entries (what a decoding
    step reads there; the rest of its allocation is not read)."""
    if isinstance(state, KVCache) and kv_positions is not None:
        return state_bytes(state) * kv_positions / state.capacity
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(item, kv_positions) for item in state)
    if isinstance(state, dict):
        return sum(state_bytes(item, kv_positions) for item in state.values())
    if dataclasses.is_dataclass(state):
        return sum(state_bytes(getattr(state, field.name), kv_positions) for field in dataclasses.fields(state))
    if state is None or isinstance(state, (bool, int, float, str)):
        return 0
    raise TypeError(f"cannot count the bytes of a {type(state).__qualname__} in a decoding state: make it a "
                    "dataclass, tuple, list or dict of tensors")


def kv_positions_read(step: Any, batch_size: int, prompt_len: int, length: int) -> float:
    """The KV-cache positions an average decoding step reads: the eager step at position ``p``
    reads its ``p + 1``; a step recorded at fixed addresses (:class:`StaticStep`) attends over its
    whole capacity bucket, up to twice that, and reads all of it."""
    if not isinstance(step, StaticStep) or batch_size not in step.buffers or not step.buffers[batch_size].capacity:
        return prompt_len + (length + 1) / 2
    capacity = step.buffers[batch_size].capacity
    return statistics.fmean(min(capacity_bucket(position + 1, step.min_capacity), capacity)
                            for position in range(prompt_len, prompt_len + length))


def build(model_cfg: dict[str, Any] | str, device: torch.device, dtype: torch.dtype, seed: int) -> CausalLM:
    """A model node built with seeded random weights, or a saved model (a path) loaded."""
    if isinstance(model_cfg, str):
        return load(model_cfg, device=device, dtype=dtype)
    torch.manual_seed(seed)  # every device's generator: the model is drawn on its own device
    return build_model(model_cfg, device=device, dtype=dtype)


def compiled_graphs() -> int:
    """How many graphs dynamo has compiled in this process so far."""
    return counters["stats"]["unique_graphs"]


@contextlib.contextmanager
def no_eager_fallback(compile: bool) -> Iterator[None]:
    """With ``compile``, a recompile past dynamo's limit raises (the point is an error) where it
    would silently run the rest eagerly."""
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=compile):
        yield


def weights_bytes(model: torch.nn.Module) -> int:
    """The bytes of every weight as stored (a quantized one's integers and scales)."""
    return sum(stored_bytes(param) for param in model.parameters())


def inference_point(
    model_cfg: dict[str, Any] | str, batch_size: int, prompt_len: int, gen_len: int, repeats: int, warmup: int,
    device: str, dtype: str, seed: int, compile: bool = False, cuda_graphs: bool = False, kernels: str = "auto",
    weights: str = "full", runtime: str = "torch",
) -> dict[str, Any]:
    """Median prefill time, decode time per token, latency, throughput, peak memory, the
    bytes of one sequence's decoding state after ``prompt_len + gen_len`` tokens, and the bytes
    a decoding step must read at least (the weights it uses, the states of its batch); with
    ``compile`` through the compiled step (compiled by the warm-up, which then runs at least
    once); with ``cuda_graphs`` through the step replayed as CUDA graphs
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
        recorded = getattr(step, "recorded", 0)
        if device_.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device_)
        runs = [run(gen_len) for _ in range(repeats)]
    return {
        **decoding_numbers(model, runs, batch_size, gen_len, peak_memory_bytes(device_)),
        "compiled": compile and compiled_graphs() > graphs,  # its own graphs, no eager fallback
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
        "compiled": False, "cuda_graphs": False, "graphs_recorded_timed": 0,
    }


def matmul_peak_flops(device: str, dtype: str, size: int = 2048, repeats: int = 10) -> float:
    """This machine's peak matrix-multiply rate (FLOP/s), the MFU denominator: the fastest of
    ``repeats`` square products after a warm-up (the best case is the peak; slower runs
    are interference)."""
    device_, dtype_ = torch.device(device), DTYPES[dtype]
    a = torch.randn(size, size, device=device_).to(dtype_)
    b = torch.randn(size, size, device=device_).to(dtype_)
    for _ in range(2):
        torch.matmul(a, b)
    seconds = min(timed(lambda: torch.matmul(a, b), device_)[0] for _ in range(repeats))
    return 2 * size**3 / seconds


def read_bandwidth_bytes_per_s(device: str, megabytes: int = 256, repeats: int = 10) -> float:
    """This machine's memory read bandwidth (bytes/s), the denominator of decoding's limit: the
    fastest of ``repeats`` sums over a buffer far larger than the caches, after a warm-up."""
    device_ = torch.device(device)
    buffer = torch.ones(megabytes * 2**20 // 4, device=device_)
    for _ in range(2):
        buffer.sum()
    seconds = min(timed(buffer.sum, device_)[0] for _ in range(repeats))
    return buffer.numel() * buffer.element_size() / seconds


def step_weight_bytes(model: CausalLM) -> int:
    """The bytes of the weights a decoding step reads in full, as stored: all but the input
    embedding (of which it reads one row), unless the LM head reads it too (tied; a quantized
    head is a copy of its own)."""
    read_embedding = model.lm_head.weight is model.embed.weight
    return sum(stored_bytes(param) for param in model.parameters() if read_embedding or param is not model.embed.weight)


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
    model_cfg: dict[str, Any] | str, form: str, batch_size: int, seq_len: int, repeats: int, warmup: int, device: str,
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
    device_, dtype_ = torch.device(device), DTYPES[dtype]
    model = build(model_cfg, device_, torch.float32, seed).train()
    model.use_kernels(kernels)
    for layer in model.layers:
        layer.activation_checkpointing = activation_checkpointing
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch_size, seq_len + 1), generator=generator).to(device_)
    position_ids = (document_positions(batch_size, seq_len, document_tokens, generator).to(device_)
                    if documents == "apart" else None)
    autocast = torch.autocast(device_.type, dtype=dtype_, enabled=dtype_ != torch.float32)

    loss_function = model.loss_function(compile)

    def step() -> None:
        with autocast:
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
