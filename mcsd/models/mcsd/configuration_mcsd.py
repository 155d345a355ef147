"""MCSD's configuration: the shared skeleton plus the block's sections and fusion."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mcsd.models.config import ConfigError, LMConfig

SECTION_KINDS = ("slope", "decay")
FUSIONS = ("concat", "sum")
DECAY_NORMS = ("rmsnorm", "sum")


@dataclasses.dataclass
class MCSDConfig(LMConfig):
    """MCSD (Section 2): ``sections`` lists each block's sections, ``fusion`` joins them.

    ``[slope, decay]`` is the paper's model; ``[slope]``, ``[decay]``, ``[slope, slope]``
    and ``[decay, decay]`` are its ablations (Section 3.5). ``fusion: concat`` is Eq. 13
    (output projection from ``len(sections) * hidden_size``), ``fusion: sum`` is Eq. 20.
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
        if not self.decay_norm_gain_init > 0:
            raise ConfigError(f"model.decay_norm_gain_init={self.decay_norm_gain_init} must be positive "
                              "(a zero gain blocks the decay branch's gradient): use e.g. 0.01")

    @classmethod
    def settings_in_effect(cls, values: Mapping[str, Any]) -> list[str]:
        """The decay settings matter only with a decay section; the gain only with the RMSNorm."""
        if "decay" not in values.get("sections", ["slope", "decay"]):
            return []
        return ["decay_norm"] + (["decay_norm_gain_init"] if values.get("decay_norm", "rmsnorm") == "rmsnorm" else [])
