"""MCSD's configuration: the shared skeleton plus the block's sections and fusion."""

from __future__ import annotations

import dataclasses

from mcsd.models.common import TokenMixer
from mcsd.models.config import ConfigError, LMConfig

SECTION_KINDS = ("slope", "decay")
FUSIONS = ("concat", "sum")


@dataclasses.dataclass
class MCSDConfig(LMConfig):
    """MCSD (Section 2): ``sections`` lists each block's sections, ``fusion`` joins them.

    ``[slope, decay]`` is the paper's model; ``[slope]``, ``[decay]``, ``[slope, slope]``
    and ``[decay, decay]`` are its ablations (Section 3.5). ``fusion: concat`` is Eq. 13
    (output projection from ``len(sections) * hidden_size``), ``fusion: sum`` is Eq. 20.
    """

    sections: list[str] = dataclasses.field(default_factory=lambda: ["slope", "decay"])
    fusion: str = "concat"

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

    def make_mixer(self, layer_index: int) -> TokenMixer:
        from mcsd.models.mcsd.block import MCSDBlock

        return MCSDBlock(self)
