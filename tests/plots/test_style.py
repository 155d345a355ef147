"""Each architecture's colour in the figures: fixed for the built-ins, a spare one of
matplotlib's cycle for one registered later, grey for one no longer registered."""

from __future__ import annotations

import dataclasses

import matplotlib.colors

from mcsd.models import registry
from mcsd.plots.style import ARCHITECTURE_COLORS, UNKNOWN_COLOR, architecture_color


def test_built_in_architectures_keep_their_colours_and_differ() -> None:
    """The figures' first architectures keep their colours; every registered one differs (the
    ones registered since take spare colours of the cycle, with no edit of the style)."""
    colours = [matplotlib.colors.to_hex(architecture_color(name)) for name in registry.architectures()]
    assert len(set(colours)) == len(colours) and matplotlib.colors.to_hex(UNKNOWN_COLOR) not in colours
    assert all(architecture_color(name) == colour for name, colour in ARCHITECTURE_COLORS.items())
    assert architecture_color("mcsd") == "tab:blue" and architecture_color("gone") == UNKNOWN_COLOR


def test_a_new_architecture_takes_a_spare_colour() -> None:
    mcsd = registry.get("mcsd")
    registry.register(dataclasses.replace(mcsd, name="spare_colour", variant_group=None, variants={"default": {}}))
    try:
        colour = matplotlib.colors.to_hex(architecture_color("spare_colour"))
        assert colour not in {matplotlib.colors.to_hex(c) for c in [*ARCHITECTURE_COLORS.values(), UNKNOWN_COLOR]}
        assert architecture_color("spare_colour") == architecture_color("spare_colour")
    finally:
        registry.unregister("spare_colour")
        mcsd.model_class.architecture = mcsd


def test_curves_of_one_architecture_with_settings_changed_differ_in_colour() -> None:
    """A study of one architecture's settings (``retnet_parts/``, ``mamba2_init/``) draws a curve per
    setting: each a colour of its own, none the architecture's, which stays with its default curve."""
    from mcsd.plots.mqar import curve_colors
    from mcsd.plots.runs import curve_key

    details = ["default", *(f"default, decay_offset={offset}" for offset in range(1, 9))]  # more than the cycle's spares
    curves = [curve_key("retnet", detail) for detail in details]
    curves.append(curve_key("mcsd", "slope_only"))
    colours = {curve: matplotlib.colors.to_hex(colour) for curve, colour in curve_colors(curves).items()}
    assert colours[curves[0]] == matplotlib.colors.to_hex(ARCHITECTURE_COLORS["retnet"])
    assert len(set(colours.values())) == len(curves)
    assert not set(colours[curve] for curve in curves[1:]) & {matplotlib.colors.to_hex(c) for c in ARCHITECTURE_COLORS.values()}
