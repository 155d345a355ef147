"""The package list, which pyproject.toml cannot write with a search plus a mapped folder:
every package below mcsd/ and hydra_plugins/ (found), and conf/ installed as mcsd.conf."""

from setuptools import find_namespace_packages, setup

setup(packages=[*find_namespace_packages(include=["mcsd", "mcsd.*", "hydra_plugins.*"]), "mcsd.conf"],
      package_dir={"mcsd.conf": "conf"})
