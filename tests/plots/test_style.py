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
    curves += [curve_key("mcsd", "slope_only"), curve_key("mcsd", "full")]
    colours = {curve: matplotlib.colors.to_hex(colour) for curve, colour in curve_colors(curves).items()}
    assert colours[curves[0]] == matplotlib.colors.to_hex(ARCHITECTURE_COLORS["retnet"])
    assert colours[curves[-1]] == matplotlib.colors.to_hex(ARCHITECTURE_COLORS["mcsd"])
    assert len(set(colours.values())) == len(curves)
    assert not set(colours[curve] for curve in curves[1:-1]) & {matplotlib.colors.to_hex(c) for c in ARCHITECTURE_COLORS.values()}


def test_an_architecture_drawn_by_one_curve_keeps_its_colour() -> None:
    """The hybrid run only with a setting changed (``attention_every=2`` at small sizes) keeps the
    hybrid's colour, as in every other figure; an architecture's default curve takes its colour
    wherever it stands among its curves; an architecture drawn only by settings changed (a study of
    its parts) gives its colour to none of them."""
    from mcsd.plots.mqar import curve_colors
    from mcsd.plots.runs import curve_key

    curves = [curve_key("wonderful_matrices", "default, attention_every=2"), curve_key("mcsd", "slope_only"),
              curve_key("mcsd", "full"), curve_key("mcsd", "decay_only"), curve_key("retnet", "default, rope=False"),
              curve_key("retnet", "default, decay_offset=2.0")]
    colours = {curve: matplotlib.colors.to_hex(colour) for curve, colour in curve_colors(curves).items()}
    assert colours[curves[0]] == matplotlib.colors.to_hex(ARCHITECTURE_COLORS["wonderful_matrices"])
    assert colours[curves[2]] == matplotlib.colors.to_hex(ARCHITECTURE_COLORS["mcsd"])
    assert not {colours[curve] for curve in curves[4:]} & {matplotlib.colors.to_hex(c) for c in ARCHITECTURE_COLORS.values()}
    assert len(set(colours.values())) == len(curves)
