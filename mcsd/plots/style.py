"""How the figures draw each architecture: its colour (the models know nothing of plotting).

The built-in architectures keep one colour in every figure; an architecture registered later
takes the first colour of matplotlib's cycle that none of the built-ins uses and no earlier
registered one took (in registry order), so that it too keeps its colour from figure to figure.
"""

from __future__ import annotations

from collections.abc import Iterable

import matplotlib.colors
import matplotlib.pyplot as plt

from mcsd.models import registry

ARCHITECTURE_COLORS = {
    "mcsd": "tab:blue",
    "transformer": "tab:orange",
    "retnet": "tab:red",
    "rwkv4": "tab:green",
    "wonderful_matrices": "tab:purple",
}
UNKNOWN_COLOR = "tab:gray"  # a curve of an architecture no longer registered


def architecture_color(arch: str) -> str:
    """The colour of architecture ``arch`` in every figure."""
    if arch in ARCHITECTURE_COLORS:
        return ARCHITECTURE_COLORS[arch]
    if arch not in registry.architectures():
        return UNKNOWN_COLOR
    taken = {matplotlib.colors.to_hex(color) for color in [*ARCHITECTURE_COLORS.values(), UNKNOWN_COLOR]}
    spare = [color for color in plt.rcParams["axes.prop_cycle"].by_key()["color"]
             if matplotlib.colors.to_hex(color) not in taken] or ["black"]
    others = [name for name in registry.architectures() if name not in ARCHITECTURE_COLORS]
    return spare[others.index(arch) % len(spare)]


def architecture_colors(present: Iterable[str] = ()) -> set[str]:
    """The colours (hex) that a figure's other curves must not take: the built-in architectures'
    (drawn or not, so that a figure's spare colours stay where they were when an architecture is
    registered) and those of the other registered architectures ``present`` in it."""
    names = [*ARCHITECTURE_COLORS, *(name for name in present if name in registry.architectures())]
    return {matplotlib.colors.to_hex(architecture_color(name)) for name in names}
