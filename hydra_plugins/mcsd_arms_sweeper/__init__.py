"""``hydra/sweeper=arms``: Hydra's basic sweeper plus a list of *arms*, each a set of overrides
that belong together (an architecture and its variant), crossed with every other sweep.

    hydra:
      sweeper:
        arms:
          - model=mcsd ablation=full
          - model=mcsd ablation=slope_only
          - model=transformer
The cartesian product of plain sweeps cannot say "the five MCSD variants and the
Transformer"; arms can. ``mcsd-train -m experiment=fig9_ablation seed=0,1,2`` runs every
arm with every seed (arms outermost).
"""

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException


@dataclass
class ArmsSweeperConf:
    _target_: str = "hydra_plugins.mcsd_arms_sweeper.ArmsSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[dict[str, str]] = None
    arms: list[Any] = field(default_factory=list)


ConfigStore.instance().store(group="hydra/sweeper", name="arms", node=ArmsSweeperConf, provider="mcsd")


def _arm_overrides(arm: Any) -> list[str]:
    """An arm as a list of ``key=value`` strings (given as one space-separated string or a list)."""
    return arm.split() if isinstance(arm, str) else [str(item) for item in arm]


class ArmsSweeper(BasicSweeper):
    """Every job of the basic sweep, once per arm (no arms: the basic sweep itself)."""

    def __init__(self, max_batch_size: Optional[int] = None, params: Optional[dict[str, str]] = None,
                 arms: Optional[list[Any]] = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.arms = [_arm_overrides(arm) for arm in (arms or [])]

    def split_arguments(self, overrides: list[Override], max_batch_size: Optional[int]) -> list[list[list[str]]]:
        jobs = [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
        if self.arms:
            swept = {override.get_key_element() for override in overrides}
            for arm in self.arms:
                clash = [item for item in arm if item.split("=", 1)[0] in swept]
                if clash:
                    raise HydraException(f"hydra.sweeper.arms sets {clash[0]} but that key is also overridden: "
                                         "set it in the arms or on the command line, not both")
            jobs = [arm + job for arm in self.arms for job in jobs]
        size = len(jobs) if max_batch_size in (None, -1) else max_batch_size
        return [jobs[start:start + size] for start in range(0, len(jobs), size)]
