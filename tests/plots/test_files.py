"""How a figure is written: a 256-colour PNG that looks like matplotlib's full-colour drawing and
weighs far less, and a PDF; the same figure gives the same bytes."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from PIL import Image

from mcsd.plots.files import PNG_COLOURS, save_figure


def _figure() -> plt.Figure:
    """Eight noisy curves with translucent bands: the kind of drawing mcsd-plot makes."""
    generator = np.random.default_rng(0)
    figure, ax = plt.subplots(figsize=(6, 4))
    for index in range(8):
        ax.plot(np.cumsum(generator.standard_normal(300)), label=f"curve {index}")
        ax.fill_between(range(300), -index, generator.random(300) - index, alpha=0.15)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return figure


def test_a_figure_is_a_palette_png_close_to_the_full_colour_drawing_and_a_pdf(tmp_path: Path) -> None:
    full = io.BytesIO()
    _figure().savefig(full, format="png", dpi=150, bbox_inches="tight")
    drawn = np.asarray(Image.open(io.BytesIO(full.getvalue())).convert("RGB"), dtype=np.int16)

    png, pdf = save_figure(_figure(), tmp_path / "made", "curves")
    assert (png.name, pdf.name) == ("curves.png", "curves.pdf") and pdf.read_bytes().startswith(b"%PDF")
    image = Image.open(png)
    assert image.mode == "P" and len(image.getcolors(maxcolors=10_000)) <= PNG_COLOURS
    assert image.text["Software"] == f"Matplotlib version{matplotlib.__version__}, https://matplotlib.org/"
    written = np.asarray(image.convert("RGB"), dtype=np.int16)
    assert written.shape == drawn.shape
    difference = np.abs(written - drawn)
    assert difference.mean() < 1.0 and np.quantile(difference, 0.99) <= 16  # on a 0-255 scale
    assert png.stat().st_size < 0.6 * len(full.getvalue())

    again, _ = save_figure(_figure(), tmp_path / "again", "curves")
    assert again.read_bytes() == png.read_bytes()
