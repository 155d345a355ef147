"""The fields every model config shares, and their validation: pure data, nothing that builds.

A model is described by the composed Hydra ``model`` node: ``_target_`` names the config
class of a registered architecture, the other keys its fields (:func:`mcsd.models.build.make_config`
turns one into a config). Every mistake is reported as one :class:`ConfigError` line naming
the field and the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mcsd.errors import MCSDError
from mcsd.ops.kernels import KERNELS


class ConfigError(MCSDError):
    """A model configuration that cannot work; the message is one line with the fix."""


def require_positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"model.{name}={value!r} must be a positive integer")


def check_range(low_name: str, low: Any, high_name: str, high: Any, papers: str) -> None:
    """Refuse bounds of a draw (``model.dt_min`` / ``dt_max``, ``a_min`` / ``a_max``) unless ``0 < low <= high``."""
    if not (isinstance(low, (int, float)) and isinstance(high, (int, float)) and 0 < low <= high):
        raise ConfigError(f"model.{low_name}={low} and model.{high_name}={high} must satisfy "
                          f"0 < {low_name} <= {high_name} ({papers})")


def check_attention_every(value: Any) -> None:
    """Refuse a ``model.attention_every`` that is not an integer >= 0."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"model.attention_every={value!r} must be an integer >= 0 "
                          "(an attention layer every that many layers; 0 for none)")


def is_attention_layer(layer_index: int, attention_every: int) -> bool:
    """Whether layer ``layer_index`` of a hybrid is an attention layer: every ``attention_every``-th
    (layers ``k-1, 2k-1, ...``; none for 0), the Wonderful Matrices hybrid's placement."""
    return attention_every > 0 and layer_index % attention_every == attention_every - 1


def check_kernels(kernels: Any) -> None:
    """Refuse a ``model.kernels`` that is not one of :data:`mcsd.ops.kernels.KERNELS`."""
    if kernels not in KERNELS:
        raise ConfigError(f"model.kernels={kernels!r} is unknown: use one of {', '.join(KERNELS)} (auto: "
                          "flash-linear-attention's kernels on a CUDA GPU, PyTorch elsewhere)")


def class_path(cls: type) -> str:
    """``module.QualName``: the ``_target_`` that names a config class."""
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclasses.dataclass
class LMConfig:
    """Fields every architecture shares: the skeleton of Section 2.1.

    Pre-RMSNorm layers, an MLP of width ``mlp_hidden_size`` (GeGLU unless the architecture
    has its own; 0: no MLP, each layer its mixer alone), token embedding, final RMSNorm and LM head. ``num_channels`` is MCSD's C
    (the head count of attention-like mixers); ``hidden_size = num_channels * channel width``.

    ``equal_params_to``: the name of an architecture whose parameter count this one
    matches. ``mlp_hidden_size`` is then that architecture's MLP width at the same
    skeleton, and this architecture's own width is chosen (a multiple of 8) so that the two
    parameter counts are as close as they can be; the resolved config holds the chosen width.

    ``kernels``: what runs the mixers' chunk and recurrent forms (:mod:`mcsd.ops.kernels`):
    ``auto`` (flash-linear-attention's kernels on a CUDA GPU where fla imports, PyTorch
    elsewhere), ``torch`` or ``fla``. It changes how, never what, a model computes.
    """

    vocab_size: int
    hidden_size: int
    num_channels: int
    num_layers: int
    mlp_hidden_size: int
    chunk_size: int = 64
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    init_std: float = 0.02
    activation_checkpointing: bool = False
    kernels: str = "auto"
    equal_params_to: str | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_channels", "num_layers", "chunk_size"):
            require_positive_int(name, getattr(self, name))
        width = self.mlp_hidden_size
        if not isinstance(width, int) or isinstance(width, bool) or width < 0:
            raise ConfigError(f"model.mlp_hidden_size={width!r} must be a positive integer (or 0: no MLP)")
        if width == 0 and self.equal_params_to is not None:
            raise ConfigError(f"model.mlp_hidden_size=0 (no MLP) leaves nothing to size for model.equal_params_to="
                              f"{self.equal_params_to}: set model.equal_params_to=null")
        check_kernels(self.kernels)
        if self.hidden_size % self.num_channels:
            raise ConfigError(
                f"model.hidden_size={self.hidden_size} is not divisible by model.num_channels="
                f"{self.num_channels}: choose a hidden_size that is num_channels * channel width"
            )

    def require_even_rope_heads(self) -> None:
        """RoPE rotates pairs of a head's features: its width (``hidden_size / num_channels``)
        must be even (an odd one fails deep in the first forward)."""
        if self.channel_width % 2:
            even = next(size for size in range(self.hidden_size + 1, 4 * self.hidden_size)
                        if size % self.num_channels == 0 and (size // self.num_channels) % 2 == 0)
            raise ConfigError(
                f"model.hidden_size={self.hidden_size} gives heads of {self.channel_width} features (hidden_size / "
                f"num_channels={self.num_channels}), and RoPE rotates pairs of them: choose a hidden_size with an "
                f"even head width, e.g. model.hidden_size={even}")

    @classmethod
    def settings_in_effect(cls, values: Mapping[str, Any]) -> list[str]:
        """The settings (fields marked ``metadata={"setting": True}``: choices the paper leaves
        open) that change a model of these field ``values``; plots name the runs that move one."""
        return [field.name for field in dataclasses.fields(cls) if field.metadata.get("setting")]

    @property
    def channel_width(self) -> int:
        """Dc (MCSD) or the head dimension (attention)."""
        return self.hidden_size // self.num_channels

    def to_dict(self) -> dict[str, Any]:
        """The config as a plain dict with its ``_target_``, as saved beside checkpoints."""
        return {"_target_": class_path(type(self)), **dataclasses.asdict(self)}

    def to_portable_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` as a model folder holds it: ``kernels: auto``, since which kernels run
        is the choice of the machine that loads it (as ``model.kernels`` is of a run)."""
        return {**self.to_dict(), "kernels": "auto"}


SKELETON_FIELDS = tuple(field.name for field in dataclasses.fields(LMConfig) if field.name != "equal_params_to")
