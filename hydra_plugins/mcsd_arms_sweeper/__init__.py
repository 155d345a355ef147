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

``registry_variants`` adds arms from the architecture registry, so that an experiment over
every architecture never lists them: for each registered architecture, one arm per variant
named in the list (``default``: its first variant; ``all``: every variant), as
``model=NAME variant=VARIANT`` (the ``variant=`` options the registry's variants are: the
variant's name travels with the job, in its overrides and its logged choices).

    hydra:
      sweeper:
        registry_variants: [default, slope_only]   # each architecture's default, and MCSD slope_only
        registry_architectures: [retnet]           # only these architectures (default: every one)

``registry_architectures`` lets a sweep add one new architecture's arms to results made before it
was registered, without running the others again. ``registry_settings`` adds overrides to one
architecture's registry arms (a setting the experiment needs for that architecture alone):

    hydra:
      sweeper:
        registry_settings:
          wonderful_matrices: [model.attention_every=2]   # 2 layers: SSD, then attention
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
    registry_variants: Optional[list[str]] = None
    registry_architectures: Optional[list[str]] = None
    registry_settings: Optional[dict[str, list[str]]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="arms", node=ArmsSweeperConf, provider="mcsd")


def _arm_overrides(arm: Any) -> list[str]:
    """An arm as a list of ``key=value`` strings (given as one space-separated string or a list)."""
    return arm.split() if isinstance(arm, str) else [str(item) for item in arm]


def registry_arms(variant_names: list[str], architectures: Optional[list[str]] = None,
                  settings: Optional[dict[str, list[str]]] = None) -> list[list[str]]:
    """One arm per registered architecture (of ``architectures``, or every one) and variant named
    in ``variant_names`` (``default``: the architecture's first variant; ``all``: every one), in
    registration order; an architecture's ``settings`` are added to each of its arms."""
    from mcsd.models import registry

    names = registry.architectures()
    settings = settings or {}
    for option, listed in (("registry_architectures", architectures or []), ("registry_settings", settings)):
        unregistered = [name for name in listed if name not in names]
        if unregistered:
            raise HydraException(f"hydra.sweeper.{option} names {unregistered[0]!r}, which is not "
                                 f"registered: use one of {', '.join(names)}")
    if architectures is not None:
        names = [name for name in names if name in architectures]
    known = {"all", "default", *(variant for name in registry.architectures() for variant in registry.get(name).variants)}
    unknown = [variant for variant in variant_names if variant not in known]
    if unknown:
        raise HydraException(f"hydra.sweeper.registry_variants names {unknown[0]!r}, a variant of no registered "
                             f"architecture: use all, default or one of {', '.join(sorted(known - {'all', 'default'}))}")
    arms = []
    for name in names:
        variants = list(registry.get(name).variants.items())
        for index, (variant, _) in enumerate(variants):
            if "all" in variant_names or variant in variant_names or (index == 0 and "default" in variant_names):
                arms.append([f"model={name}", f"variant={variant}", *(str(item) for item in settings.get(name, []))])
    if architectures is not None and not arms:
        raise HydraException(f"hydra.sweeper.registry_variants {variant_names} names no variant of "
                             f"{', '.join(names)}: add default or all")
    return arms


class ArmsSweeper(BasicSweeper):
    """Every job of the basic sweep, once per arm (no arms: the basic sweep itself)."""

    def __init__(self, max_batch_size: Optional[int] = None, params: Optional[dict[str, str]] = None,
                 arms: Optional[list[Any]] = None, registry_variants: Optional[list[str]] = None,
                 registry_architectures: Optional[list[str]] = None,
                 registry_settings: Optional[dict[str, list[str]]] = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        chosen = None if registry_architectures is None else list(registry_architectures)
        settings = {name: list(items) for name, items in (registry_settings or {}).items()}
        self.arms = [_arm_overrides(arm) for arm in (arms or [])] + registry_arms(
            list(registry_variants or []), chosen, settings)

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
