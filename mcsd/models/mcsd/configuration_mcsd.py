"""MCSD's configuration: the shared skeleton plus the block's sections and fusion."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mcsd.models.config import ConfigError, LMConfig, check_attention_every

SECTION_KINDS = ("slope", "decay")
FUSIONS = ("concat", "sum")
DECAY_NORMS = ("rmsnorm", "sum")


@dataclasses.dataclass
class MCSDConfig(LMConfig):
    """MCSD (Section 2): ``sections`` lists each block's sections, ``fusion`` joins them.

    ``[slope, decay]`` is the paper's model; ``[slope]``, ``[decay]``, ``[slope, slope]``
    and ``[decay, decay]`` are its ablations (Section 3.5). ``fusion: concat`` is Eq. 13
    (output projection from ``len(sections) * hidden_size``), ``fusion: sum`` is Eq. 20.

    Three switches go beyond the paper, each a registered variant (issue 90: what MCSD needs to
    recall), each off by default: ``short_conv``, ``input_decay`` and ``attention_every``.
    """

    sections: list[str] = dataclasses.field(default_factory=lambda: ["slope", "decay"])
    fusion: str = "concat"
    # Choices the paper leaves open in the decay section (a "setting": plots name runs that
    # change one; "legacy": the value of runs logged before the field existed).
    decay_norm: str = dataclasses.field(default="rmsnorm", metadata={"setting": True, "legacy": "rmsnorm"})
    """How the decay history ``W_d E`` is normalised: ``rmsnorm`` (Eq. 12 as written: an RMSNorm
    over each channel's features, with a learned gain) or ``sum`` (each row of ``W_d`` divided by
    its sum, a weighted average as the slope section's softmax; no gain)."""
    decay_norm_gain_init: float = dataclasses.field(default=0.01, metadata={"setting": True, "legacy": 1.0})
    """Initial value of the decay RMSNorm's gain (``decay_norm: rmsnorm``). At 1 (the value before
    experiments/decay_init_study/) the decay branch starts at unit scale per feature while the
    slope branch starts near 0.002, and MCSD trains far worse; 0.01 was the study's best."""

    short_conv: int = 0
    """Taps of a short causal convolution (:class:`~mcsd.models.modules.conv.ShortConvolution`,
    then SiLU) on the block's input, before its projections: each section then reads the token's
    ``short_conv - 1`` neighbours directly (0: none, the paper's block; 4: Mamba's and fla's)."""
    input_decay: bool = False
    """Whether the decay sections' coefficients come from the token, as GLA's gate does:
    ``alpha_{n,i} = sigmoid(w_i . x_n + b_i)`` per channel, instead of the fixed ``1 - 2^(-5-i)``.
    ``w`` starts at 0 and ``b_i`` at ``logit(1 - 2^(-5-i))``, so the block starts as the paper's."""
    attention_every: int = 0
    """An attention layer (the Transformer's, with RoPE and a KV cache) in place of the MCSD block
    at every ``attention_every``-th layer (0: none): the Wonderful Matrices hybrid's recipe."""
    rope_base: float = 10000.0
    """RoPE's base in the attention layers (``attention_every``)."""

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
        if self.decay_norm not in DECAY_NORMS:
            raise ConfigError(f"model.decay_norm={self.decay_norm!r} is unknown: use {' or '.join(DECAY_NORMS)}")
        if not isinstance(self.short_conv, int) or isinstance(self.short_conv, bool) or self.short_conv < 0:
            raise ConfigError(f"model.short_conv={self.short_conv!r} must be an integer >= 0 (the taps of the "
                              "convolution before the block; 0 for none, e.g. 4)")
        if not isinstance(self.input_decay, bool):
            raise ConfigError(f"model.input_decay={self.input_decay!r} must be true or false")
        if self.input_decay and "decay" not in self.sections:
            raise ConfigError(f"model.input_decay=true changes the decay sections, and model.sections={self.sections} "
                              "has none: add a decay section or set model.input_decay=false")
        if self.input_decay and self.decay_norm != "rmsnorm":
            raise ConfigError("model.input_decay=true normalises the decay history with the RMSNorm only: "
                              "set model.decay_norm=rmsnorm (or model.input_decay=false)")
        check_attention_every(self.attention_every)
        if self.attention_every:
            self.require_even_rope_heads()
        if not self.decay_norm_gain_init > 0:
            raise ConfigError(f"model.decay_norm_gain_init={self.decay_norm_gain_init} must be positive "
                              "(a zero gain blocks the decay branch's gradient): use e.g. 0.01")

    @classmethod
    def settings_in_effect(cls, values: Mapping[str, Any]) -> list[str]:
        """The decay settings matter only with a decay section; the gain only with the RMSNorm."""
        if "decay" not in values.get("sections", ["slope", "decay"]):
            return []
        return ["decay_norm"] + (["decay_norm_gain_init"] if values.get("decay_norm", "rmsnorm") == "rmsnorm" else [])
