"""What every figure of ``mcsd-plot`` shares: it is written as PNG and PDF."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image, PngImagePlugin  # noqa: E402  (matplotlib's own dependency)

# A figure's PNG keeps this many colours: line plots with antialiased edges look the same with a
# 256-colour palette and weigh a third of the full RGBA image, which keeps the committed results
# (every experiment folder's figures) within what travels to a GPU machine.
PNG_COLOURS = 256


def write_palette_png(drawn_png: bytes, path: Path) -> None:
    """Write matplotlib's full-colour PNG ``drawn_png`` to ``path`` flattened onto white with a
    256-colour palette, keeping its text chunks (matplotlib's version, which tells which drawings
    are comparable byte for byte)."""
    drawn = Image.open(io.BytesIO(drawn_png))
    flat = Image.new("RGB", drawn.size, "white")
    flat.paste(drawn, mask=drawn.getchannel("A") if drawn.mode == "RGBA" else None)
    info = PngImagePlugin.PngInfo()
    for key, value in drawn.text.items():
        info.add_text(key, value)
    flat.quantize(PNG_COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        path, format="png", pnginfo=info)


def save_figure(figure: plt.Figure, output_dir: str | Path, name: str) -> list[Path]:
    """Write ``<name>.png`` and ``<name>.pdf`` to ``output_dir`` (made if missing), close the
    figure, and return the two paths. The same figure gives the same bytes every time."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    png, pdf = output_dir / f"{name}.png", output_dir / f"{name}.pdf"
    drawn = io.BytesIO()  # stored uncompressed: decoded at once, its pixels the same (a fifth of a save's time)
    figure.savefig(drawn, format="png", dpi=150, bbox_inches="tight", pil_kwargs={"compress_level": 0})
    write_palette_png(drawn.getvalue(), png)
    # no creation date in the PDF: drawing the same results again writes the same bytes
    figure.savefig(pdf, dpi=150, bbox_inches="tight", metadata={"CreationDate": None})
    plt.close(figure)
    return [png, pdf]
