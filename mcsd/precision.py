"""The project's one precision vocabulary: the dtypes a model runs in, by name (:data:`DTYPES`;
FSDP2's ``mixed_precision`` takes their short names, :data:`SHORT_NAMES`), what ``auto`` chooses
wherever a setting takes it (:func:`auto_dtype`: bf16 on a GPU that supports it, fp32 elsewhere),
and how a model computes (:class:`Precision`: its weights' dtype and its products', named as
Lightning's ``trainer.precision``, which it reads).

A model cast to bf16 or fp16 runs every form and decodes in that dtype; what stays fp32 whatever
the dtype: every recurrent state (MCSD's section states, RetNet's, RWKV-4's, the SSD's), the
chunkwise forms' carries, MCSD's fixed slope and decay weights (from float64 logs), the losses
and the probes' log-likelihoods. A KV cache, which holds the keys and values themselves, follows
the model's dtype.
"""

from __future__ import annotations

import dataclasses

import torch

from mcsd.errors import MCSDError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHORT_NAMES = {"fp32": "float32", "bf16": "bfloat16"}  # trainer.strategy.mixed_precision's names (besides auto)


def dtype_name(dtype: torch.dtype) -> str:
    """The :data:`DTYPES` name of ``dtype`` (``bfloat16``)."""
    return next(name for name, value in DTYPES.items() if value == dtype)


def auto_dtype(device: str | torch.device) -> torch.dtype:
    """What ``auto`` means wherever a setting takes it: bf16 on a GPU that supports it, fp32
    elsewhere (a CPU, an older GPU)."""
    device = torch.device(device)
    supported = device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return torch.bfloat16 if supported else torch.float32


@dataclasses.dataclass(frozen=True)
class Precision:
    """How a model computes, one type wherever the project says so: the dtype its weights are
    stored in and the dtype its products run in, under autocast where the two differ (``mixed``,
    as Lightning's ``bf16-mixed``: fp32 weights). Its :attr:`name` is Lightning's
    ``trainer.precision`` string, which :meth:`of_trainer` reads. ``mcsd-bench`` measures a
    training step in :meth:`mixed` precision (as ``mcsd-train`` trains) and decoding in
    :meth:`cast` precision (as the inference commands run), and each row says which."""

    weights: torch.dtype
    compute: torch.dtype

    @classmethod
    def cast(cls, dtype: torch.dtype) -> Precision:
        """Weights and products in ``dtype`` (the model cast to it: ``bf16-true``)."""
        return cls(dtype, dtype)

    @classmethod
    def mixed(cls, dtype: torch.dtype) -> Precision:
        """fp32 weights, products in ``dtype`` under autocast (``bf16-mixed``; ``32-true`` for fp32)."""
        return cls(torch.float32, dtype)

    @classmethod
    def of_trainer(cls, precision: str | int | None) -> Precision:
        """A Lightning ``trainer.precision``: ``bf16-mixed``, ``bf16-true`` -> bf16 products;
        ``16-mixed``, ``16-true``, 16 -> fp16; ``32-true``, 32, 64 and ``None`` -> fp32; weights
        in the products' dtype for ``-true``, else fp32."""
        text = str(precision)
        compute = torch.bfloat16 if text.startswith("bf16") else torch.float16 if text.startswith("16") else torch.float32
        return cls(compute if text.endswith("-true") else torch.float32, compute)

    @property
    def name(self) -> str:
        """Lightning's name of it (``bf16-mixed``, ``bf16-true``, ``32-true``)."""
        short = {torch.float32: "32", torch.bfloat16: "bf16", torch.float16: "16"}[self.compute]
        return f"{short}-{'mixed' if self.weights != self.compute else 'true'}"

    def autocast(self, device: str | torch.device) -> torch.autocast:
        """The autocast of its products on ``device`` (enabled only where weights and products differ)."""
        return torch.autocast(torch.device(device).type, dtype=self.compute, enabled=self.weights != self.compute)


def mixed_precision_dtype(setting: str, device: str | torch.device) -> torch.dtype:
    """The dtype FSDP2's ``mixed_precision`` setting (``auto`` or one of :data:`SHORT_NAMES`)
    computes in on ``device``."""
    return auto_dtype(device) if setting == "auto" else DTYPES[SHORT_NAMES[setting]]


def check_device(device: str | torch.device, setting: str = "device") -> None:
    """A ``device`` setting this machine has: a CUDA device only where a GPU is visible (torch
    would end in a traceback once the model is read), refused in one line with the fix."""
    name = str(device)
    try:
        kind = torch.device(name).type
    except (RuntimeError, TypeError):
        raise MCSDError(f"{setting}={name!r} is not a device: use cpu, or cuda (cuda:N) on a machine with a GPU") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise MCSDError(f"{setting}={name} needs a CUDA GPU, and none is visible here: use {setting}=cpu")


def model_dtype(setting: str, device: str | torch.device) -> torch.dtype:
    """The dtype a ``dtype`` setting names: ``auto`` is bf16 on a GPU that supports it, fp32
    elsewhere (a CPU, an older GPU); otherwise one of :data:`DTYPES`. A wrong value is one line
    naming the setting and the choices."""
    if setting == "auto":
        return auto_dtype(device)
    if setting not in DTYPES:
        raise MCSDError(f"dtype={setting!r} is not a dtype: use auto, {', '.join(DTYPES)}")
    return DTYPES[setting]
