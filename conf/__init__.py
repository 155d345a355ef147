"""Hydra configs of mcsd: conf/ at the top of the repository, installed as the package mcsd.conf."""
