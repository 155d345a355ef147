"""What a command's model entry names, resolved once: a registered architecture at a size (the
``model`` node that ``mcsd-train model=NAME size=SIZE`` builds), a run's config YAML (its
``model`` node: the trained run's model with seeded random weights, which cost what its trained
weights cost), or a saved model (:class:`~mcsd.checkpoint.saved_model.SavedModel`: a model
folder, a run directory, a checkpoint, an export or its Hub repository).

``mcsd-bench``'s ``models`` entries are these; :func:`resolve` reads each once (a registered
name's config composed, a YAML's node parsed, either resolved to its config, equal-size widths
included; a saved model's config read) and the measuring process opens
:attr:`ModelSource.spec`: the resolved config, built at once, or the saved model's path, read
once more for its weights.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hydra import compose
from omegaconf import OmegaConf

from mcsd.checkpoint.run_folder import model_node_of
from mcsd.checkpoint.saved_model import SavedModel, locate
from mcsd.errors import MCSDError
from mcsd.models import registry
from mcsd.models.build import make_config
from mcsd.models.config import LMConfig
from mcsd.models.registry import Architecture

REGISTERED, RUN_CONFIG, SAVED = "registered", "config", "saved"  # the kinds of source


def is_run_config(entry: str | Path) -> bool:
    """Whether an entry is a YAML file: a run's logged config (``hparams.yaml``) or a ``model``
    node of its own."""
    return Path(entry).suffix in (".yaml", ".yml")


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """One entry resolved: its ``kind`` (:data:`REGISTERED`, :data:`RUN_CONFIG`, :data:`SAVED`),
    the architecture and variant it is, its resolved config (equal-size widths resolved once,
    here) and where it came from: a ``model`` node (a registered name, a run's config) or the
    located saved model."""

    entry: str
    kind: str
    architecture: Architecture
    variant: str
    config: LMConfig
    node: dict[str, Any] | None = None
    saved: SavedModel | None = None

    @property
    def spec(self) -> LMConfig | str:
        """What a measuring process opens: the resolved config (random weights, built at once),
        or the saved model's path (its weights)."""
        return self.config if self.saved is None else str(self.saved.path)

    def size_label(self, size: str) -> str:
        """A result row's ``size``: ``size`` for a registered architecture, else the kind
        (``config``: a run's config with random weights; ``saved``: a saved model)."""
        return size if self.kind == REGISTERED else self.kind


def resolve(entry: str, size: str, variant: str | None = None) -> ModelSource:
    """The source ``entry`` names: a registered architecture (at ``size``, with ``variant``
    where the architecture has one of that name: ``conf/build.yaml`` composed, in a running
    Hydra app), a run's config YAML, or a saved model."""
    if entry in registry.architectures():
        architecture = registry.get(entry)
        overrides = [f"model={entry}", f"size={size}"] + ([f"variant={variant}"] if variant in architecture.variants
                                                          else [])
        node = OmegaConf.to_container(compose("build", overrides=overrides).model, resolve=True)
        return ModelSource(entry, REGISTERED, architecture, architecture.variant_of(node), make_config(node), node=node)
    if is_run_config(entry):
        node = model_node_of(entry)
        if node is None:
            raise MCSDError(f"models: {entry} holds no model node (a `model:` with its `_target_`): give a run's "
                            "csv/version_0/hparams.yaml or .hydra/config.yaml")
        config = make_config(node)
        architecture = registry.of_config(config)
        return ModelSource(entry, RUN_CONFIG, architecture, architecture.variant_of(node), config, node=node)
    saved = locate(entry)  # its config read once here; the measuring process reads the rest (a checkpoint once)
    return ModelSource(entry, SAVED, saved.architecture, saved.variant, saved.config(), saved=saved)
