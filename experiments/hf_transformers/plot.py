"""The figure of results.csv: decoding tokens/s of HF generate and of the project's own decoding."""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from mcsd.models import registry  # noqa: E402


def main(results: Path) -> Path:
    rows = pd.read_csv(results)
    labels = [registry.get(arch).label for arch in rows["arch"]]
    positions = range(len(rows))
    figure, axis = plt.subplots(figsize=(7, 3.6))
    axis.bar([p - 0.2 for p in positions], rows["mcsd_tokens_per_s"], width=0.4, label="mcsd-generate (CausalLM.stream)")
    axis.bar([p + 0.2 for p in positions], rows["hf_tokens_per_s"], width=0.4, label="transformers generate")
    for position, ratio, value in zip(positions, rows["hf_over_mcsd_time"], rows["hf_tokens_per_s"]):
        axis.annotate(f"{ratio:.2f}x time", (position + 0.2, value), ha="center", va="bottom", fontsize=8)
    axis.set_xticks(list(positions), labels, fontsize=8)
    axis.set_ylabel("tokens / s (median)")
    first = rows.iloc[0]
    axis.set_title(f"Greedy decoding, batch 1, {first['tokens']} tokens, size=small, {first['threads']} thread, eager",
                   fontsize=9)
    axis.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    out = results.with_name("hf_generate.png")
    figure.savefig(out, dpi=150)
    return out


if __name__ == "__main__":
    print(main(Path(sys.argv[1])))
