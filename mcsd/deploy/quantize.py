"""Weight formats for decoding (``weights=full|int8|int4``): the linear layers' weights stored
in 8 or 4 bits through torchao's weight-only configs, for every architecture.

At batch 1 a decoding step reads every weight once per token, so its time is the bytes it
reads: 8-bit weights read a quarter of fp32's bytes, 4-bit an eighth. Weight-only: the
activations, the sums and every recurrent state keep the model's dtype (the recurrent states
fp32, as always: :mod:`mcsd.precision`).

- ``int8``: torchao's ``Int8WeightOnlyConfig``, one symmetric scale per output row; any dtype.
  Its product is ``mm(x, weight.to(x.dtype).t()) * scale``: eager PyTorch dequantizes the whole
  weight at every product; ``torch.compile`` rewrites it into torch's int8 kernel
  ``_weight_int8pack_mm`` (which reads the 8-bit weight itself) only for bfloat16 activations
  (inductor's weight-only pattern), and with fp32 ones writes a dequantized fp32 copy of every
  weight at every step (decoding 8x slower than fp32 weights, ``experiments/edge_decoding/``). So
  on a CPU ``dtype=auto`` runs int8 in bfloat16, as int4; ``dtype=float32`` stays allowed.
- ``int4``: torchao's CPU int4 (``PrototypeInt4WeightOnlyConfig``: torch's tinygemm kernel
  ``_weight_int4pack_mm_for_cpu``), an asymmetric scale and zero per group of
  :data:`INT4_GROUP_SIZE` inputs. The kernel's fast path takes bfloat16 activations (with fp32
  ones it dequantizes the whole weight first, 6x slower than fp32 here), so int4 runs the model
  in bfloat16 (``dtype=auto`` picks it) and is a CPU format: torchao's GPU int4 needs the mslk
  kernels, which this harness does not install.

Which weights: every ``nn.Linear`` (projections, MLPs, the LM head). What stays in the model's
dtype: the embedding table (a step reads one row of it, so it costs no bandwidth), a tied LM
head's table (the head gets a quantized copy of its own, the embedding keeps the full one), the
norms' gains, the per-channel projections (MCSD's grouped ``in_proj``: an einsum over ``C``
small matrices, about 5% of a layer's weights at ``size=base``, which no torchao kernel takes),
RWKV-4's decays and mixes, the hybrid's CDMoE expert tables (looked up, like the embedding),
and, with int4, a linear the kernel cannot tile (:func:`int4_fits`: left whole, e.g. the hybrid's
``dt_proj``, one output per head).
"""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

from mcsd.errors import MCSDError
from mcsd.precision import check_device, model_dtype
from mcsd.runtime import quiet_torchao_import
from mcsd.models import CausalLM

WEIGHT_FORMATS = ("full", "int8", "int4")
INT4_GROUP_SIZE = 32  # inputs per int4 scale and zero: tinygemm takes 32-256; 32 loses the least
INT4_OUTPUT_MULTIPLE = 16  # tinygemm's CPU packing takes outputs in tiles of 16
INSTALL_HINT = "pip install 'mcsd[edge]' (torchao)"


def check_weight_format(weights: str, dtype: torch.dtype | None = None, device: str | torch.device = "cpu") -> None:
    """Refuse, in one line naming the setting and the fix, a ``weights`` setting that cannot run:
    an unknown format, torchao missing, int4 off a CPU or with activations other than bfloat16
    (``dtype`` is the model's, if already chosen)."""
    if weights not in WEIGHT_FORMATS:
        raise MCSDError(f"weights={weights!r} is not a weight format: use {', '.join(WEIGHT_FORMATS)}")
    if weights == "full":
        return
    if importlib.util.find_spec("torchao") is None:
        raise MCSDError(f"weights={weights} needs torchao, which is not installed: {INSTALL_HINT}, or weights=full")
    if weights == "int4":
        if torch.device(device).type != "cpu":
            raise MCSDError(f"weights=int4 is a CPU format (torchao's CPU int4 kernel; its GPU one needs mslk): "
                            f"use weights=int8 on {device}, or device=cpu")
        if dtype is not None and dtype != torch.bfloat16:
            raise MCSDError(f"weights=int4 runs on bfloat16 activations (its CPU kernel's fast path), not "
                            f"{str(dtype).removeprefix('torch.')}: "
                            "set dtype=bfloat16 or dtype=auto")


def int4_fits(linear: nn.Linear) -> bool:
    """Whether torch's CPU int4 kernel takes ``linear``: inputs a multiple of the group, outputs of its tile."""
    return linear.in_features % INT4_GROUP_SIZE == 0 and linear.out_features % INT4_OUTPUT_MULTIPLE == 0


def runs_in_bfloat16(weights: str, device: str | torch.device) -> bool:
    """Whether ``weights`` has its fast CPU kernel only with bfloat16 activations: int4 (anywhere
    it runs) and int8 on a CPU (see the module's docstring)."""
    return weights == "int4" or (weights == "int8" and torch.device(device).type == "cpu")


def weights_dtype(weights: str, dtype: torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """The dtype a benchmark point runs in with ``weights``: bfloat16 where its kernel's fast path
    needs it (:func:`runs_in_bfloat16`), else ``dtype``."""
    return torch.bfloat16 if runs_in_bfloat16(weights, device) else dtype


def decoding_dtype(dtype: str, weights: str, device: str | torch.device) -> torch.dtype:
    """The dtype a command's ``dtype`` setting names with ``weights`` (``dtype=auto`` with int4, or
    int8 on a CPU: bfloat16), both refused in one line where they cannot run together, as is a
    device this machine does not have."""
    check_device(device)
    chosen = (torch.bfloat16 if dtype == "auto" and runs_in_bfloat16(weights, device)
              else model_dtype(dtype, device))
    check_weight_format(weights, chosen, device)
    return chosen


def weight_format(model: nn.Module) -> str:
    """The weight format of ``model``'s linear layers: what :func:`quantize_weights` made, or ``full``."""
    return getattr(model, "weight_format", "full")


def quantize_weights(model: CausalLM, weights: str) -> CausalLM:
    """Store ``model``'s linear weights in ``weights`` (see the module's docstring), in place, and
    return it; ``full`` leaves it as it is. The model should be on its device and in its dtype
    already (int4: bfloat16 on a CPU). Quantizing twice, or a model being trained, is refused."""
    check_weight_format(weights, model.embed.weight.dtype, model.embed.weight.device)
    if weights == "full":
        return model
    if weight_format(model) != "full":
        raise MCSDError(f"the model's weights are already {weight_format(model)}: load it again to use weights={weights}")
    if model.training:
        raise MCSDError(f"weights={weights} is for decoding and scoring: call model.eval() first (a quantized "
                        "weight has no gradient)")
    quiet_torchao_import()
    from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    # set_inductor_config=False: torch.compile keeps the settings the rest of the harness runs with.
    config = (Int8WeightOnlyConfig(set_inductor_config=False) if weights == "int8"
              else PrototypeInt4WeightOnlyConfig(group_size=INT4_GROUP_SIZE, set_inductor_config=False))
    chosen = int4_fits if weights == "int4" else (lambda _: True)
    quantize_(model, config, filter_fn=lambda module, _: isinstance(module, nn.Linear) and chosen(module))
    model.weight_format = weights
    return model


def quantized_linears(model: nn.Module) -> dict[str, str]:
    """Each linear layer's weight format by name: ``full``, or the tensor class holding it
    (torchao's ``Int8Tensor``, ``Int4OpaqueTensor``)."""
    return {name: ("full" if type(module.weight) in (torch.Tensor, nn.Parameter) else type(module.weight).__name__)
            for name, module in model.named_modules() if isinstance(module, nn.Linear)}


def stored_bytes(tensor: torch.Tensor) -> int:
    """The bytes ``tensor`` holds in memory: a quantized weight's integers and scales (the tensors
    its class flattens into), not its logical shape at its dtype's width."""
    if not hasattr(type(tensor), "__tensor_flatten__"):
        return tensor.numel() * tensor.element_size()
    names, _ = tensor.__tensor_flatten__()
    return sum(stored_bytes(inner) for name in names if (inner := getattr(tensor, name)) is not None)
