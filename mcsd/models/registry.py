"""The architecture registry: every architecture registers itself once, and everything that
lists architectures (building and loading, ``mcsd-bench``, ``mcsd-plot``, lm-eval, the
tests) reads it from here.

An architecture is a folder under ``mcsd/models/`` whose ``__init__`` calls :func:`register`
(the built-in folders are imported by ``mcsd.models``); code elsewhere may register more.
The registry is data: the config nodes it implies (``model/<name>`` for an architecture without
a YAML of its own, ``variant=`` and ``ablation=`` options from its variants) are stored by the
command layer (:mod:`mcsd.commands.config_nodes`), told of each change (:func:`on_change`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import ListConfig

from mcsd.models.config import ConfigError, LMConfig, class_path
from mcsd.models.modeling import CausalLM
from mcsd.ops import OPS
from mcsd.ops.common import FORMS
from mcsd.ops.kernels import FLA_KERNELS

ROLES = ("subject", "anchor", "related")
"""The roles an architecture plays in the comparison, in the order they are listed."""


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One registered architecture.

    - ``forms``: the forms its mixers compute (all of ``parallel``, ``chunk``, ``recurrent``
      for an exact architecture);
    - ``train_form``: the form that training and scoring use (its fastest exact form);
    - ``variants``: named settings of its own fields (MCSD's ablations, switches), each run
      by the conformance tests; the first is the architecture's default. Each is an option of
      the ``variant=`` config group (names are unique across architectures, but for a
      ``default`` that sets nothing), and of ``variant_group`` where the architecture has a
      word of its own for them (MCSD: ``ablation``, the paper's).
    - ``setting_cases``: non-default values of its settings (config fields marked
      ``setting``: choices the paper leaves open), each also run by the conformance tests.
    - ``role``: ``subject`` (MCSD), ``anchor`` (the baseline every result is read against: the
      Transformer) or ``related`` (the related papers' systems, and any architecture registered
      later); :func:`architectures` lists them in that order, each role in registration order.
    - ``fp32_constants``: whether the architecture computes constants in fp32 by design (MCSD's
      slope and decay weights), which bounds how closely its forms agree in an fp64 model;
      otherwise every computation follows the input's dtype and its forms agree to fp64
      round-off (the conformance tests check it).
    - ``ops``: the ops of :mod:`mcsd.ops` its mixers run over positions (:data:`mcsd.ops.OPS`);
      ``model.kernels`` hands those of them that fla has kernels for to flash-linear-attention
      (:attr:`fla_ops`); attention runs SDPA's fused kernels whatever ``kernels`` says.
    """

    name: str
    config_class: type[LMConfig]
    model_class: type[CausalLM]
    label: str
    forms: tuple[str, ...] = FORMS
    train_form: str = "chunk"
    variants: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=lambda: {"default": {}})
    setting_cases: tuple[Mapping[str, Any], ...] = ()
    fp32_constants: bool = False
    role: str = "related"
    ops: tuple[str, ...] = ()
    variant_group: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(f"architecture {self.name}: role={self.role!r} is unknown: use one of {', '.join(ROLES)}")
        unknown_ops = sorted(set(self.ops) - set(OPS))
        if unknown_ops:
            raise ConfigError(f"architecture {self.name}: ops {unknown_ops} are not ops of mcsd.ops: use some of "
                              f"{', '.join(OPS)}")
        unknown = [form for form in (*self.forms, self.train_form) if form not in FORMS]
        if unknown or self.train_form not in self.forms:
            raise ConfigError(f"architecture {self.name}: forms {self.forms} / train_form {self.train_form!r} "
                              f"must be among {', '.join(FORMS)} (train_form one of its forms)")

    @property
    def fla_ops(self) -> tuple[str, ...]:
        """Those of :attr:`ops` that ``model.kernels`` can hand to fla's kernels."""
        return tuple(op for op in self.ops if op in {op for op, _ in FLA_KERNELS})

    def variant_of(self, values: Mapping[str, Any]) -> str:
        """The name of the variant a model node (or config dict) is, by the fields variants set,
        followed by the settings in effect that differ from their defaults (``full,
        decay_norm_gain_init=1.0``). A node that matches no variant is described by the fields
        that differ from the default variant. A setting the node lacks is a log from before the
        setting existed: it takes the field's ``legacy`` value.
        """
        keys = sorted({key for overrides in self.variants.values() for key in overrides})
        defaults = field_defaults(self.config_class)

        def setting(overrides: Mapping[str, Any]) -> dict[str, Any]:
            return {key: _plain(overrides.get(key, defaults.get(key))) for key in keys}

        actual = {key: _plain(values.get(key, defaults.get(key))) for key in keys}
        name = next((name for name, overrides in self.variants.items() if setting(overrides) == actual), None)
        if name is None:
            default = setting(next(iter(self.variants.values())))
            name = ", ".join(f"{key}={_describe(actual[key])}" for key in keys if actual[key] != default[key])
        legacy = {field.name: field.metadata.get("legacy", defaults.get(field.name))
                  for field in dataclasses.fields(self.config_class)}
        completed = {**legacy, **values}
        changed = [f"{key}={_describe(_plain(completed[key]))}"
                   for key in self.config_class.settings_in_effect(completed)
                   if _plain(completed[key]) != _plain(defaults.get(key))]
        return ", ".join([name, *changed])


def field_defaults(config_class: type[LMConfig]) -> dict[str, Any]:
    """The fields of a config class that have defaults, with their default values."""
    defaults = {}
    for field in dataclasses.fields(config_class):
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory()
    return defaults


def _plain(value: Any) -> Any:
    """Lists, tuples and OmegaConf lists compare as plain lists."""
    return list(value) if isinstance(value, (list, tuple, ListConfig)) else value


def _describe(value: Any) -> str:
    return "+".join(map(str, value)) if isinstance(value, list) else str(value)


_ARCHITECTURES: dict[str, Architecture] = {}


_LISTENERS: list[Callable[[], None]] = []


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener`` after every :func:`register` and :func:`unregister` from now on."""
    _LISTENERS.append(listener)


def register(architecture: Architecture) -> Architecture:
    """Add ``architecture``: its name must be new, and each of its variants' names new too
    (``default`` may recur where it sets nothing)."""
    if architecture.name in _ARCHITECTURES:
        raise ConfigError(f"architecture {architecture.name!r} is registered already: choose another name")
    for variant, fields in architecture.variants.items():
        owners = [other.name for other in _ARCHITECTURES.values() if variant in other.variants
                  and (fields or other.variants[variant])]
        if owners:
            raise ConfigError(f"architecture {architecture.name}: variant {variant!r} is a variant of {owners[0]} "
                              "already: name it otherwise (variant= options are shared by every architecture)")
    _ARCHITECTURES[architecture.name] = architecture
    architecture.model_class.architecture = architecture
    for listener in _LISTENERS:
        listener()
    return architecture


def unregister(name: str) -> None:
    """Remove an architecture (tests that register one of their own clean up with it)."""
    _ARCHITECTURES.pop(name)
    for listener in _LISTENERS:
        listener()


def architectures() -> list[str]:
    """The registered architectures' names: the subject, the anchor, then the related ones, each
    role in registration order."""
    return sorted(_ARCHITECTURES, key=lambda name: ROLES.index(_ARCHITECTURES[name].role))


def get(name: str) -> Architecture:
    """The architecture called ``name``; a one-line error lists the known ones."""
    if name not in _ARCHITECTURES:
        raise ConfigError(f"architecture {name!r} is not registered: use one of {', '.join(architectures())}")
    return _ARCHITECTURES[name]


def of_config(config: LMConfig | type[LMConfig]) -> Architecture:
    """The architecture whose config class ``config`` is (or is an instance of)."""
    cls = config if isinstance(config, type) else type(config)
    for architecture in _ARCHITECTURES.values():
        if architecture.config_class is cls:
            return architecture
    raise ConfigError(f"{cls.__qualname__} is not the config class of a registered architecture: register it")


def of_target(target: str | None) -> Architecture | None:
    """The architecture whose config class a ``_target_`` names: its full path, or a path that
    ends in the same class name (configs saved before the class moved, e.g.
    ``mcsd.models.config.MCSDConfig``)."""
    if not target:
        return None
    for architecture in _ARCHITECTURES.values():
        if class_path(architecture.config_class) == target:
            return architecture
    for architecture in _ARCHITECTURES.values():
        if target.rsplit(".", 1)[-1] == architecture.config_class.__qualname__:
            return architecture
    return None
