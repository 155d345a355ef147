"""RWKV-4's configuration: the shared skeleton; its MLP is RWKV's channel mix of width
``mlp_hidden_size`` (chosen for equal size), its mixer the WKV time mix."""

from __future__ import annotations

import dataclasses

from mcsd.models.config import ConfigError, LMConfig, require_positive_int


@dataclasses.dataclass
class RWKV4Config(LMConfig):
    """RWKV-4 (Peng et al. 2023): per-channel time mix (token shift, WKV with learned decay
    and bonus, receptance gate) and channel mix (token shift, squared ReLU, receptance gate).
    ``chunk_size`` is the block of the WKV's chunkwise form.

    ``perspectives`` (P, default 1): the multiple-temporal-perspectives switch, P residual
    streams sharing every weight but the mixes mu, merged before the LM head by softmax weights
    from W_agg (drawn at ``aggregator_init_std``, the paper's noise); P = 1 is RWKV-4 itself.
    The MLP width for equal size is chosen at P = 1, so that perspectives add only their own
    parameters and a trained P = 1 model's weights fit every P.
    """

    chunk_size: int = 8  # measured fastest for training (its per-chunk tensors are [B, C, C, D])
    perspectives: int = dataclasses.field(default=1, metadata={"setting": True, "legacy": 1, "sized_at": 1})
    aggregator_init_std: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive_int("perspectives", self.perspectives)
        if not self.aggregator_init_std >= 0:
            raise ConfigError(f"model.aggregator_init_std={self.aggregator_init_std!r} must be >= 0")
