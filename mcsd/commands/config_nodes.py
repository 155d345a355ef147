"""The config nodes the registry implies, stored in Hydra's ConfigStore (the registry itself is
data and knows nothing of Hydra):

- ``model/<name>``: an architecture without a ``conf/model/<name>.yaml`` composes from its config
  class's defaults (``mcsd-train model=<name>``);
- ``variant/<name>``: every architecture's variants, one option each (``mcsd-train model=mcsd
  variant=slope_only``), setting every field the architecture's variants set;
- an architecture's own word for its variants (``Architecture.variant_group``: MCSD's
  ``ablation=``, the paper's Section 3.5), the same options under that group.

``mcsd.conf`` (the configs' package, imported by every composition, the commands' and the
tests') stores them once, and again whenever an architecture is registered or removed.
"""

from __future__ import annotations

import importlib.resources
from typing import Any

from hydra.core.config_store import ConfigStore

from mcsd.models import registry
from mcsd.models.config import class_path

VARIANT_GROUP = "variant"
_stored: set[tuple[str, str]] = set()  # (group, option) this module stored


def variant_node(architecture: registry.Architecture, variant: str) -> dict[str, Any]:
    """The ``model`` fields a variant sets: its own values, and the default variant's (the config
    class's defaults) for every other field that some variant of the architecture sets, so that a
    variant given with another architecture's model is refused (:func:`mcsd.models.build.make_config`)."""
    defaults = registry.field_defaults(architecture.config_class)
    fields = architecture.variants[variant]
    keys = [*fields, *sorted({key for other in architecture.variants.values() for key in other} - set(fields))]
    return {key: list(value) if isinstance(value, tuple) else value
            for key, value in ((key, fields.get(key, defaults.get(key))) for key in keys)}


def store_config_nodes() -> None:
    """Store (again) every node the registered architectures imply, and drop those of
    architectures no longer registered."""
    store = ConfigStore.instance()
    for group, option in _stored:
        store.repo.get(group, {}).pop(f"{option}.yaml", None)
    _stored.clear()
    conf = importlib.resources.files("mcsd.conf")
    for name in registry.architectures():
        architecture = registry.get(name)
        if not (conf / "model" / f"{name}.yaml").is_file():
            node = {"_target_": class_path(architecture.config_class), **registry.field_defaults(architecture.config_class)}
            _store(store, "model", name, node, package=None)
        groups = [VARIANT_GROUP] + ([architecture.variant_group] if architecture.variant_group else [])
        for variant in architecture.variants:
            for group in groups:
                _store(store, group, variant, {"model": variant_node(architecture, variant)}, package="_global_")


def _store(store: ConfigStore, group: str, option: str, node: dict[str, Any], package: str | None) -> None:
    store.store(group=group, name=option, node=node, package=package, provider="mcsd")
    _stored.add((group, option))
