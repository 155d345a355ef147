"""What every figure of ``mcsd-plot`` shares: it is written as PNG and PDF."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save_figure(figure: plt.Figure, output_dir: str | Path, name: str) -> list[Path]:
    """Write ``<name>.png`` and ``<name>.pdf`` to ``output_dir`` (made if missing), close the
    figure, and return the two paths. The same figure gives the same bytes every time."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = [output_dir / f"{name}.{suffix}" for suffix in ("png", "pdf")]
    for path in paths:  # no creation date in the PDF: drawing the same results again writes the same bytes
        figure.savefig(path, dpi=150, bbox_inches="tight",
                       metadata={"CreationDate": None} if path.suffix == ".pdf" else None)
    plt.close(figure)
    return paths
