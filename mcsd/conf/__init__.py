"""Hydra configs of mcsd (installed as the package mcsd.conf)."""
