"""How far the fine-tuned perspectives moved apart, and how the aggregator weighs them: per
fine-tuned model of the latest sweep, the largest move of a mix from the base, the largest
spread of a mix between perspectives, and the weights alpha over 4 x 256 tokens of the
training text's end (mean |alpha - 1/P|: 0 is a plain average, 1 - 1/P one perspective per token).

    python experiments/rwkv_perspectives/perspective_weights.py [CORPUS_NAME]   # after run.sh
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import mcsd

here = Path(__file__).resolve().parent
name = sys.argv[1] if len(sys.argv) > 1 else "tinyshakespeare"
logs = here / "logs" / name
base = mcsd.load(logs / "base").state_dict()
sweep = max((logs / "train" / "multiruns").iterdir())
lines = ["| P | largest move of a mix from the base | largest spread between perspectives | alpha min-max | "
         "mean abs(alpha - 1/P) |", "| --- | --- | --- | --- | --- |"]
for job in sorted((path for path in sweep.iterdir() if (path / "model").is_dir()), key=lambda path: int(path.name)):
    model = mcsd.load(job)
    count, weights = model.config.perspectives, model.state_dict()
    mixes = [key for key in weights if ".mix_" in key]
    moved = max((weights[key] - base[key].reshape(1, -1)).abs().max().item() for key in mixes)
    spread = max((weights[key].amax(0) - weights[key].amin(0)).max().item() for key in mixes)
    cells = [f"{count}", f"{moved:.4f}", f"{spread:.4f}", "", ""]
    if count > 1:
        text = (logs / "split" / "train.txt").read_text()[-40000:]
        ids = torch.tensor(mcsd.load_tokenizer(job).encode(text).ids[:4 * 256]).reshape(4, 256)
        with torch.no_grad():
            streams = model.streams.split(model.embed(ids))
            for layer in model.layers:
                streams, _ = layer(streams, None, 0, model.default_form)
            alpha = model.streams.weights(model.final_norm(streams))
        cells[3:] = [f"{alpha.min():.3f}-{alpha.max():.3f}", f"{(alpha - 1 / count).abs().mean():.3f}"]
    lines.append("| " + " | ".join(cells) + " |")
table = "\n".join(lines) + "\n"
(here / name).mkdir(exist_ok=True)
(here / name / "perspective_weights.md").write_text(table)
print(table, end="")
