"""Helpers the tests share (``pyproject.toml`` puts ``tests/`` on the path: ``from helpers.models
import tiny_model``): ``models`` (tiny models and how their outputs are compared), ``runs``
(composing and running the commands, reading what they wrote), and the repository's folders."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root (a clone's top folder)."""
FIXTURES = ROOT / "tests" / "fixtures"
"""Files the tests read: pinned weights and logits, logs of an early sweep."""
