"""Hydra configs of mcsd: conf/ at the top of the repository, installed as the package mcsd.conf.

Importing it (every composition does: the commands' ``pkg://mcsd.conf``, the tests'
``initialize_config_module("mcsd.conf")``) stores the config nodes the architecture registry
implies beside these files: ``model/<name>`` for an architecture without a YAML here, and the
``variant=`` and ``ablation=`` options (:mod:`mcsd.commands.config_nodes`)."""

from mcsd.commands.config_nodes import store_config_nodes
from mcsd.models import registry

store_config_nodes()
registry.on_change(store_config_nodes)
