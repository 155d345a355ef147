"""Mamba-2's configuration: the shared skeleton plus the SSD's inner width, state size, short
convolution and the ranges its dt and A are drawn from."""

from __future__ import annotations

import dataclasses

from mcsd.models.config import ConfigError, LMConfig, check_range, require_positive_int

IN_PROJ_INITS = ("normal", "uniform")
"""How the input projection is drawn: ``normal``, Normal(0, ``init_std``) as every projection here;
``uniform``, nn.Linear's own U(+-1/sqrt(D)) as the paper's code (mamba_ssm) keeps it."""


@dataclasses.dataclass
class Mamba2Config(LMConfig):
    """Mamba-2 (Dao and Gu 2024), heads = ``num_channels``: an inner width of ``expand`` x D
    (the paper: 2), per head ``expand x D / heads`` features, a state of ``state_size`` per head
    feature (B and C shared over the heads, one group), a causal convolution of ``conv_size``
    taps over x, B and C (the paper: 4); dt's bias drawn log-uniform in [``dt_min``, ``dt_max``]
    and ``A`` uniform in [``a_min``, ``a_max``] (the paper's 0.001, 0.1; 1, 16); the input
    projection drawn as ``in_proj_init`` says (:data:`IN_PROJ_INITS`), the skip ``D`` starting at
    ``skip_init`` (the paper: 1).
    ``chunk_size`` is the block of its chunkwise form."""

    expand: int = 2
    state_size: int = 64
    conv_size: int = 4
    dt_min: float = 0.001
    dt_max: float = 0.1
    a_min: float = 1.0
    a_max: float = 16.0
    # Its initialisation, one switch each, for the study of why it stays at chance on MQAR (a "setting":
    # plots name the runs that change one; "legacy": runs logged before it existed).
    in_proj_init: str = dataclasses.field(default="normal", metadata={"setting": True, "legacy": "normal"})
    """How the input projection (x, B, C, z, dt) is drawn: :data:`IN_PROJ_INITS`."""
    skip_init: float = dataclasses.field(default=1.0, metadata={"setting": True, "legacy": 1.0})
    """The skip ``D``'s initial value (the paper: 1)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("expand", "state_size", "conv_size"):
            require_positive_int(name, getattr(self, name))
        if (self.expand * self.hidden_size) % self.num_channels:
            raise ConfigError(f"model.expand={self.expand} x hidden_size={self.hidden_size} must divide into "
                              f"num_channels={self.num_channels} heads")
        check_range("dt_min", self.dt_min, "dt_max", self.dt_max, "the paper: 0.001, 0.1")
        check_range("a_min", self.a_min, "a_max", self.a_max, "the paper: 1, 16")
        if not isinstance(self.skip_init, (int, float)) or isinstance(self.skip_init, bool):
            raise ConfigError(f"model.skip_init={self.skip_init!r} must be a number (the skip D's initial value; "
                              "the paper: 1)")
        if self.in_proj_init not in IN_PROJ_INITS:
            raise ConfigError(f"model.in_proj_init={self.in_proj_init!r} is unknown: use one of "
                              f"{', '.join(IN_PROJ_INITS)} (uniform: nn.Linear's own, as the paper's code)")
