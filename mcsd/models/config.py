"""Model configurations and their validation.

A model is described by the composed Hydra ``model`` node: ``_target_`` names the config
class (:class:`MCSDConfig` or :class:`TransformerConfig`), the other keys its fields.
Every mistake is reported as one :class:`ConfigError` line naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mcsd.errors import MCSDError

SECTION_KINDS = ("slope", "decay")
FUSIONS = ("concat", "sum")
FORMS = ("parallel", "chunk", "recurrent")


class ConfigError(MCSDError):
    """A model configuration that cannot work; the message is one line with the fix."""


def _positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"model.{name}={value!r} must be a positive integer")


@dataclasses.dataclass
class LMConfig:
    """Fields shared by both architectures: the skeleton of Section 2.1.

    Pre-RMSNorm layers, a GeGLU MLP of width ``mlp_hidden_size``, token embedding, final
    RMSNorm and LM head. ``num_channels`` is MCSD's C (and the Transformer's head count);
    ``hidden_size = num_channels * head width``.
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

    arch = "lm"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_channels", "num_layers", "mlp_hidden_size", "chunk_size"):
            _positive_int(name, getattr(self, name))
        if self.hidden_size % self.num_channels:
            raise ConfigError(
                f"model.hidden_size={self.hidden_size} is not divisible by model.num_channels="
                f"{self.num_channels}: choose a hidden_size that is num_channels * channel width"
            )

    @property
    def channel_width(self) -> int:
        """Dc (MCSD) or the head dimension (Transformer)."""
        return self.hidden_size // self.num_channels

    def to_dict(self) -> dict[str, Any]:
        """The config as a plain dict with its ``_target_``, as saved beside checkpoints."""
        cls = type(self)
        return {"_target_": f"{cls.__module__}.{cls.__qualname__}", **dataclasses.asdict(self)}


@dataclasses.dataclass
class MCSDConfig(LMConfig):
    """MCSD (Section 2): ``sections`` lists each block's sections, ``fusion`` joins them.

    ``[slope, decay]`` is the paper's model; ``[slope]``, ``[decay]``, ``[slope, slope]``
    and ``[decay, decay]`` are its ablations (Section 3.5). ``fusion: concat`` is Eq. 13
    (output projection from ``len(sections) * hidden_size``), ``fusion: sum`` is Eq. 20.
    """

    sections: list[str] = dataclasses.field(default_factory=lambda: ["slope", "decay"])
    fusion: str = "concat"

    arch = "mcsd"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.sections = list(self.sections)
        if not self.sections:
            raise ConfigError("model.sections is empty: list at least one of slope, decay")
        for kind in self.sections:
            if kind not in SECTION_KINDS:
                raise ConfigError(
                    f"model.sections has unknown section {kind!r}: use {' or '.join(SECTION_KINDS)}"
                )
        if self.fusion not in FUSIONS:
            raise ConfigError(f"model.fusion={self.fusion!r} is unknown: use {' or '.join(FUSIONS)}")


@dataclasses.dataclass
class TransformerConfig(LMConfig):
    """The baseline: the same skeleton with RoPE causal attention, heads = ``num_channels``.

    ``chunk_size`` is the query block of its chunkwise form (chunked prefill through the
    KV cache).
    """

    rope_base: float = 10000.0

    arch = "transformer"


CONFIG_CLASSES: dict[str, type[LMConfig]] = {
    f"{cls.__module__}.{cls.__qualname__}": cls for cls in (MCSDConfig, TransformerConfig)
}


def make_config(model_cfg: Mapping[str, Any] | DictConfig | LMConfig) -> LMConfig:
    """Turn a composed ``model`` node (DictConfig or dict) into a validated config."""
    if isinstance(model_cfg, LMConfig):
        return model_cfg
    if isinstance(model_cfg, DictConfig):
        values = OmegaConf.to_container(model_cfg, resolve=True)
    else:
        values = dict(model_cfg)
    target = values.pop("_target_", None)
    if target not in CONFIG_CLASSES:
        known = ", ".join(CONFIG_CLASSES)
        raise ConfigError(f"model._target_={target!r} is not a model config: use one of {known}")
    cls = CONFIG_CLASSES[target]
    fields = {field.name for field in dataclasses.fields(cls)}
    for key in values:
        if key in fields:
            continue
        if key in ("sections", "fusion"):
            raise ConfigError(
                f"model.{key} is an MCSD block setting but the model is {cls.arch}: "
                "drop the ablation/fusion override or use model=mcsd"
            )
        raise ConfigError(f"model.{key} is not a {cls.arch} setting: remove it (known: {', '.join(sorted(fields))})")
    missing = [field.name for field in dataclasses.fields(cls) if field.name not in values
               and field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"model.{missing[0]} is missing: set it, e.g. with a size=... config")
    return cls(**values)
