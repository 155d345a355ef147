"""A model's decoding as two ONNX graphs, for ONNX Runtime outside PyTorch (``mcsd-export
format=onnx``; the runner is :mod:`mcsd.deploy.onnx_runner`).

- ``prefill.onnx``: ``input_ids`` ``[B, N]`` (int64) -> ``logits`` ``[B, vocab]`` of the last
  position, and the decoding state after the prompt, ``state.0 ..``: the parallel form (one graph
  for every prompt length and batch size, where the chunk and recurrent forms' loops would be
  traced at one length), into KV caches of ``capacity`` positions.
- ``step.onnx``: ``token_ids`` ``[B]``, ``position`` (a 0-d int64: the tokens seen so far), the
  state -> ``logits`` ``[B, vocab]`` and the state after the token, ``new_state.0 ..``: the step at
  fixed addresses (:meth:`CausalLM.static_step`: a KV cache of ``capacity`` positions written at
  ``position`` and read over its whole length, masked after it), so the state is explicit:
  recurrent states in fp32 as in PyTorch, KV caches in the model's dtype.
- ``export.json``: what the runner needs (the state's names, the capacity, the vocabulary, the
  tokenizer's end of text) and what the export was made from.

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

from mcsd.errors import MCSDError
from mcsd.models import CausalLM, registry
from mcsd.models.modules.state import CapacityState, LayerState, map_tensors, tensors_of

MANIFEST_FILE = "export.json"
PREFILL_FILE, STEP_FILE = "prefill.onnx", "step.onnx"
FORMAT_VERSION = 1
INSTALL_HINT = "pip install 'mcsd[edge]' (onnx, onnxscript, onnxruntime)"


def _layer_parts(layers: list[LayerState]) -> list[Any]:
    return [part for layer in layers for part in (layer.mixer, layer.mlp)]


def prefilled(model: CausalLM, input_ids: torch.Tensor, capacity: int) -> tuple[torch.Tensor, list[LayerState]]:
    """The prompt ``input_ids`` in the parallel form from no state: the last position's logits and
    every layer's state after it, each KV cache ``capacity`` positions, zeros past the prompt (an
    entry the step reads before it is written must be finite: the mask multiplies it by 0)."""
    state = model.init_state(input_ids.shape[0], capacity)
    for part in _layer_parts(state.layers):
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


class StepGraph(nn.Module):
    """What ``step.onnx`` computes: one token into a copy of the state given (ONNX has no
    in-place update of an input), through :meth:`CausalLM.static_step`."""

    def __init__(self, model: CausalLM, template: list[LayerState]) -> None:
        super().__init__()
        self.model, self.template = model, template

    def forward(self, token_ids: torch.Tensor, position: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        copies = iter([tensor.clone() for tensor in state])
        layers = map_tensors(self.template, lambda _: next(copies))
        logits = self.model.static_step(token_ids, layers, position)
        return (logits, *tensors_of(layers))


def check_onnx_installed() -> None:
    """Refuse in one line an export or a run without the ONNX packages."""
    import importlib.util

    missing = [name for name in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(name) is None]
    if missing:
        raise MCSDError(f"format=onnx needs {', '.join(missing)}, not installed: {INSTALL_HINT}")


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
                      source: str = "") -> dict[str, Any]:
    """Write ``prefill.onnx``, ``step.onnx`` and ``export.json`` for ``model`` (eval, on the CPU)
    into ``folder``; KV caches hold ``capacity`` positions (a prompt and its continuation must
    fit). Returns the manifest."""
    check_onnx_installed()
    if capacity < 2:
        raise MCSDError(f"capacity={capacity} must be at least 2 positions (a prompt and one new token)")
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
    architecture = registry.of_config(model.config)
    manifest = {
        "format": "mcsd-onnx", "format_version": FORMAT_VERSION,
        "architecture": architecture.name, "config": model.config.to_dict(),
        "vocab_size": model.config.vocab_size, "capacity": capacity,
        "has_kv_cache": any(isinstance(part, CapacityState) for part in _layer_parts(state)),
        "state": [{"name": name, "dtype": str(tensor.dtype).removeprefix("torch.")} for name, tensor in zip(names, flat)],
        "eos_token_id": eos_token_id, "dtype": str(model.embed.weight.dtype).removeprefix("torch."),
        "torch": torch.__version__, "source": source,
    }
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
