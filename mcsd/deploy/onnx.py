"""A model's decoding as two ONNX graphs, for ONNX Runtime outside PyTorch (``mcsd-export
format=onnx``; the runner is :mod:`mcsd.deploy.onnx_runner`).

- ``prefill.onnx``: ``input_ids`` ``[B, N]`` (int64) -> ``logits`` ``[B, vocab]`` of the last
  position, and the decoding state after the prompt, ``state.0 ..``: the parallel form (one graph
  for every prompt length and batch size, where the chunk and recurrent forms' loops would be
  traced at one length), into KV caches of ``capacity`` positions.
- ``step.onnx``: ``token_ids`` ``[B]``, ``position`` (a 0-d int64: the tokens seen so far), the
  state -> ``logits`` ``[B, vocab]`` and ``new_state.0 ..``: a recurrent state after the token
  (fp32, as in PyTorch), and for a KV cache (in the model's dtype) the token's entries alone,
  ``[B, H, 1, ..]``, which the runner writes at ``position`` in place. The step reads each KV cache
  over its whole capacity, the positions from ``position`` on masked, and attends to its own key
  and value beside them (:class:`~mcsd.ops.attention.ReadOnlyKVCache`): a graph that
  wrote the token into its input would copy every cache at every step (ONNX has no in-place
  update of an input), which made an export of format 1 decode the Transformer slower than eager
  PyTorch.
- ``export.json``: what the runner needs (the state's names, the capacity, the vocabulary, the
  tokenizer's end of text) and what the export was made from.

``weights=int8|int4``: each graph's weight products quantized by ONNX Runtime's own weight-only
quantizer (``MatMulNBits``: 8 or 4 bits, symmetric, one scale per block of 32 inputs, as torchao's
int4 groups; activations stay fp32), after the exporter's linears written as ``Gemm`` (a step's
``[B, D]`` rows) are rewritten as the ``MatMul`` the quantizer takes. What stays full is what
stays full in PyTorch (:mod:`mcsd.deploy.quantize`): embeddings are gathers, products of two
activations and MCSD's grouped ``in_proj`` (an ``Einsum``) are not weight matmuls.

Why ONNX and not ExecuTorch: ONNX Runtime installs from PyPI beside the pinned torch, runs the
graphs torch's own exporter (``torch.onnx.export(dynamo=True)``) writes, and has a CPU kernel for
every op the five architectures use; ExecuTorch's runtime is built for a target with its own
toolchain, a step this harness cannot test on its CPU.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mcsd.deploy.onnx_runner import MANIFEST_FILE, PREFILL_FILE, STEP_FILE
from mcsd.deploy.quantize import weight_format
from mcsd.errors import MCSDError
from mcsd.models import CausalLM, registry
from mcsd.ops.attention import KVCache, ReadOnlyKVCache
from mcsd.models.modules.state import CapacityState, LayerState, map_parts, map_tensors, parts_of, tensors_of

FORMAT_VERSION = 2  # 2: the step returns a KV cache's entries of the token alone (1: the whole cache)
INSTALL_HINT = "pip install 'mcsd[edge]' (onnx, onnxscript, onnxruntime)"


def prefilled(model: CausalLM, input_ids: torch.Tensor, capacity: int) -> tuple[torch.Tensor, list[LayerState]]:
    """The prompt ``input_ids`` in the parallel form from no state: the last position's logits and
    every layer's state after it, each KV cache ``capacity`` positions, zeros past the prompt (an
    entry the step reads before it is written must be finite: the mask multiplies it by 0)."""
    state = model.init_state(input_ids.shape[0], capacity)
    for part in parts_of(state.layers):
        if isinstance(part, CapacityState):
            part.zero_positions_from_(0)
    hidden, state = model.run(input_ids, state, "parallel")
    return model.lm_head(hidden[:, -1]), state.layers


class PrefillGraph(nn.Module):
    """What ``prefill.onnx`` computes: the prompt in the parallel form into a fresh state."""

    def __init__(self, model: CausalLM, capacity: int) -> None:
        super().__init__()
        self.model, self.capacity = model, capacity

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logits, layers = prefilled(self.model, input_ids, self.capacity)
        return (logits, *tensors_of(layers))


def read_only_caches(value: Any) -> Any:
    """A layer state as the exported step takes it: each KV cache read-only (the step returns the
    token's entries), every other tensor a copy (a recurrent step may advance its state in place,
    and ONNX has no in-place update of an input)."""
    def read_only(part: Any) -> Any:
        if isinstance(part, KVCache):
            return ReadOnlyKVCache.of(part)  # the same tensors
        return part.clone()

    return map_parts(value, read_only)


class StepGraph(nn.Module):
    """What ``step.onnx`` computes: one token through :meth:`CausalLM.step_entries` on the state
    given, its KV caches read and not written (:func:`read_only_caches`)."""

    def __init__(self, model: CausalLM, template: list[LayerState]) -> None:
        super().__init__()
        self.model, self.template = model, template

    def forward(self, token_ids: torch.Tensor, position: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        given = iter(state)
        layers = read_only_caches(map_tensors(self.template, lambda _: next(given)))
        logits, advanced = self.model.step_entries(token_ids, layers, position)
        return (logits, *tensors_of(advanced))


def written_at_position(layers: list[LayerState]) -> list[bool]:
    """For each tensor of ``layers`` (in :func:`tensors_of`' order): whether it is a KV cache's,
    whose step output is the token's entries to write at the position, not the whole state."""
    return [isinstance(part, KVCache) for part in parts_of(layers) for _ in tensors_of(part)]


def check_onnx_installed() -> None:
    """Refuse in one line an export or a run without the ONNX packages."""
    import importlib.util

    missing = [name for name in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(name) is None]
    if missing:
        raise MCSDError(f"format=onnx needs {', '.join(missing)}, not installed: {INSTALL_HINT}")


ONNX_WEIGHT_BITS = {"int8": 8, "int4": 4}  # weights= of an ONNX export -> MatMulNBits' bits
ONNX_BLOCK_SIZE = 32  # inputs per quantization scale
# MatMulNBits' compute: 4 quantizes each block of activations to int8 and multiplies in integers (MLAS's
# int8 kernels, AVX2/AVX512-VNNI or NEON dot products). The default (0) dequantizes the weights to fp32
# at every call: on an x86-64 core, 8-bit weights then ran 8x slower than fp32 at batch 1
# (docs/deploying.md).
ONNX_ACCURACY_LEVEL = 4


def check_onnx_weights(weights: str) -> None:
    """Refuse in one line a ``weights`` that an ONNX export cannot hold."""
    if weights != "full" and weights not in ONNX_WEIGHT_BITS:
        raise MCSDError(f"weights={weights!r} is not a weight format of an ONNX export: use full, "
                        f"{' or '.join(ONNX_WEIGHT_BITS)}")


def gemm_as_matmul(graph: Any) -> None:
    """Rewrite in place every ``Gemm`` of ``graph`` whose weight is a constant (``B``, not transposed
    on ``A``, alpha = beta = 1) as ``MatMul`` by that weight (transposed once, if the Gemm did),
    plus ``Add`` of its bias: what ONNX Runtime's weight quantizer takes."""
    from onnx import helper, numpy_helper

    constants = {initializer.name: initializer for initializer in graph.initializer}
    nodes = []
    for node in graph.node:
        attributes = {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}
        if (node.op_type != "Gemm" or node.input[1] not in constants or attributes.get("transA", 0)
                or attributes.get("alpha", 1.0) != 1.0 or attributes.get("beta", 1.0) != 1.0):
            nodes.append(node)
            continue
        weight = node.input[1]
        if attributes.get("transB", 0):
            transposed = numpy_helper.to_array(constants[weight]).T.copy()
            weight = f"{weight}_as_matmul"
            graph.initializer.append(numpy_helper.from_array(transposed, weight))
        has_bias = len(node.input) > 2 and node.input[2]
        product = f"{node.output[0]}_product" if has_bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], weight], [product], name=f"{node.name}_matmul"))
        if has_bias:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}_bias"))
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    unused = [initializer for initializer in graph.initializer if initializer.name not in used]
    for initializer in unused:
        graph.initializer.remove(initializer)


def quantize_onnx_weights(path: Path, weights: str) -> int:
    """Quantize the weight products of the ONNX graph at ``path`` in place to ``weights`` (int8 or
    int4, :data:`ONNX_WEIGHT_BITS`) with ONNX Runtime's ``MatMulNBitsQuantizer``; return how many
    ``MatMulNBits`` the graph now holds."""
    import onnx

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:  # its import calls logging.basicConfig at INFO: every library's INFO lines would then print
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    finally:
        root.handlers[:], root.level = handlers, level

    model = onnx.load(str(path))
    gemm_as_matmul(model.graph)
    quantizer_log = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = quantizer_log.level
    quantizer_log.setLevel(logging.WARNING)  # a line per node it leaves alone
    try:
        quantizer = MatMulNBitsQuantizer(model, bits=ONNX_WEIGHT_BITS[weights], block_size=ONNX_BLOCK_SIZE,
                                         is_symmetric=True, accuracy_level=ONNX_ACCURACY_LEVEL)
        quantizer.process()
    finally:
        quantizer_log.setLevel(level)
    quantized = quantizer.model.model
    onnx.save(quantized, str(path))
    return sum(node.op_type == "MatMulNBits" for node in quantized.graph.node)


def graph_weight_bytes(path: Path) -> tuple[int, int]:
    """The bytes of the ONNX graph's constants as stored (a quantized weight's integers and
    scales), and of those a step reads whole: all but the ones only looked up (``Gather``: the
    embedding table, a few rows a step)."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    uses: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            uses.setdefault(name, set()).add(node.op_type)
    sizes = {initializer.name: numpy_helper.to_array(initializer).nbytes for initializer in graph.initializer}
    read = sum(size for name, size in sizes.items() if uses.get(name, set()) - {"Gather"})
    return sum(sizes.values()), read


def _export(module: nn.Module, arguments: tuple, path: Path, input_names: list[str], output_names: list[str],
            dynamic: tuple) -> None:
    """``torch.onnx.export`` through ``torch.export`` (dynamo), quietly: its progress lines and
    warnings go to the log, an error is one line naming the graph."""
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            # torch.export first, then the program to ONNX: handed the module, the exporter's own
            # trace of the step with a dynamic batch leaves an aten.sym_stride it cannot translate.
            program = torch.export.export(module, arguments, dynamic_shapes=dynamic, strict=False)
            torch.onnx.export(program, f=str(path), dynamo=True, input_names=input_names, output_names=output_names,
                              verbose=False, external_data=False)
    except Exception as error:  # torch.export and the ONNX translation raise many kinds
        while error.__cause__ is not None:  # the exporter wraps the error that says what failed
            error = error.__cause__
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise MCSDError(f"exporting {path.name} failed ({type(error).__name__}: {reason[:300]}): "
                        "report it with the model's architecture and size") from None


def write_onnx_export(model: CausalLM, folder: Path, capacity: int, eos_token_id: int | None,
                      source: str = "", weights: str = "full") -> dict[str, Any]:
    """Write ``prefill.onnx``, ``step.onnx`` and ``export.json`` for ``model`` (eval, on the CPU,
    full weights) into ``folder``; KV caches hold ``capacity`` positions (a prompt and its
    continuation must fit); ``weights=int8|int4`` quantizes the graphs' weight products
    (:func:`quantize_onnx_weights`). Returns the manifest."""
    check_onnx_installed()
    if capacity < 2:
        raise MCSDError(f"capacity={capacity} must be at least 2 positions (a prompt and one new token)")
    if weight_format(model) != "full":
        raise MCSDError(f"the model's linears are already {weight_format(model)}: export the model with full "
                        "weights and give the export weights= (ONNX Runtime quantizes the graphs)")
    check_onnx_weights(weights)
    model = model.eval()
    example = torch.zeros(2, 3, dtype=torch.long)  # two rows: the batch stays a dimension of the graphs
    with torch.no_grad():
        _, state = prefilled(model, example, capacity)  # the state's structure, which the step keeps
    flat = tensors_of(state)
    names = [f"state.{index}" for index in range(len(flat))]
    batch = torch.export.Dim.AUTO
    _export(PrefillGraph(model, capacity), (example,), folder / PREFILL_FILE, ["input_ids"], ["logits", *names],
            ({0: batch, 1: torch.export.Dim("length", min=1, max=capacity - 1)},))  # room for one new token
    position = torch.tensor(3)
    _export(StepGraph(model, state), (example[:, 0], position, *flat), folder / STEP_FILE,
            ["token_ids", "position", *names], ["logits", *(f"new_{name}" for name in names)],
            ({0: batch}, None, tuple({0: batch} for _ in flat)))  # the state: one argument, *state
    quantized = {} if weights == "full" else {
        path.name: quantize_onnx_weights(path, weights) for path in (folder / PREFILL_FILE, folder / STEP_FILE)}
    architecture = registry.of_config(model.config)
    manifest = {
        "format": "mcsd-onnx", "format_version": FORMAT_VERSION,
        "architecture": architecture.name, "config": model.config.to_dict(),
        "vocab_size": model.config.vocab_size, "capacity": capacity,
        "has_kv_cache": any(isinstance(part, CapacityState) for part in parts_of(state)),
        "state": [{"name": name, "dtype": str(tensor.dtype).removeprefix("torch."),
                   "step_output": "entries" if entries else "state"}
                  for name, tensor, entries in zip(names, flat, written_at_position(state))],
        "eos_token_id": eos_token_id, "dtype": str(model.embed.weight.dtype).removeprefix("torch."),
        "weights": weights, "quantized_matmuls": quantized,
        "torch": torch.__version__, "source": source,
    }
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
