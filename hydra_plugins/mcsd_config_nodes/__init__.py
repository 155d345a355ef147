"""The registry's config nodes for every composition: Hydra imports each module of the
``hydra_plugins`` namespace when it starts (its plugin scan), and importing ``mcsd.conf`` stores the
``model/<name>``, ``variant=`` and ``ablation=`` options (:mod:`mcsd.commands.config_nodes`). So
Hydra's own ways of composing the configs as a folder (``initialize_config_dir``,
``initialize(config_path=...)``) find them, as ``initialize_config_module("mcsd.conf")`` does.

An editable install's packages cannot be listed (its finder's path hook), so Hydra's scan misses
this module there, as it misses the sweeper and the launcher (the commands register those by
hand): in an editable checkout, compose with ``initialize_config_module("mcsd.conf")`` or import
``mcsd.conf`` first (docs/configs.md)."""

import mcsd.conf  # noqa: F401  stores the nodes
