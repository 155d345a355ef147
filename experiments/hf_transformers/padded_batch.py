"""A padded batch through Hugging Face ``generate``: 8 prompts of mixed lengths decoded in one
batch (each row exactly as alone, issue 92) against row by row, greedy, at size=small, eager,
side by side in one process, alternating, medians over repeats; and its figure.

    python experiments/hf_transformers/padded_batch.py --out experiments/hf_transformers/padded_batch.csv
    python experiments/hf_transformers/padded_batch.py --out experiments/hf_transformers/padded_batch.csv --draw
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import matplotlib
import torch
from hydra import initialize_config_module

import mcsd
from mcsd.checkpoint.model_source import resolve
from mcsd.hf import as_hf_model
from mcsd.models import registry

from bench import write_rows  # noqa: E402  (this folder's bench.py: run as a script, its folder is on sys.path)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ARCHITECTURES = ("mcsd", "transformer")  # the pair; any registered name works


def padded(prompts: list[torch.Tensor], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts as one batch padded on ``side`` (pad id 0) and its attention mask."""
    width = max(len(prompt) for prompt in prompts)
    ids, mask = torch.zeros(len(prompts), width, dtype=torch.long), torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        columns = slice(width - len(prompt), width) if side == "left" else slice(0, len(prompt))
        ids[row, columns], mask[row, columns] = prompt, 1
    return ids, mask


def batched(hf_model, ids: torch.Tensor, mask: torch.Tensor, tokens: int) -> torch.Tensor:
    output = hf_model.generate(ids, attention_mask=mask, max_new_tokens=tokens, do_sample=False)
    return output[:, ids.shape[1]:]


def row_by_row(hf_model, prompts: list[torch.Tensor], tokens: int) -> torch.Tensor:
    return torch.stack([hf_model.generate(prompt[None], attention_mask=torch.ones_like(prompt)[None],
                                          max_new_tokens=tokens, do_sample=False)[0, len(prompt):]
                        for prompt in prompts])


def draw(rows: list[dict], out: Path) -> None:
    figure, axis = plt.subplots(figsize=(6.5, 3.4))
    labels = [f"{registry.get(row['arch']).label}\n{row['side']} padding" for row in rows]
    positions = range(len(rows))
    axis.bar([p - 0.2 for p in positions], [row["row_by_row_tokens_per_s"] for row in rows], width=0.4,
             label="row by row")
    axis.bar([p + 0.2 for p in positions], [row["batched_tokens_per_s"] for row in rows], width=0.4,
             label="one padded batch")
    for position, row in zip(positions, rows):
        axis.annotate(f"{row['speedup']:.2f}x", (position + 0.2, row["batched_tokens_per_s"]), ha="center",
                      va="bottom", fontsize=8)
    axis.set_xticks(list(positions), labels, fontsize=8)
    axis.set_ylabel("new tokens / s (median)")
    axis.set_ylim(top=1.25 * max(row["batched_tokens_per_s"] for row in rows))
    first = rows[0]
    axis.set_title(f"transformers generate, {first['prompts']:g} prompts of {first['prompt_lengths']} tokens, "
                   f"{first['tokens']:g} new each,\nsize={first['size']}, greedy, {first['threads']:g} thread, eager", fontsize=9)
    axis.legend(fontsize=8, loc="upper left", ncol=2)
    figure.tight_layout()
    figure.savefig(out, dpi=150)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per prompt")
    parser.add_argument("--lengths", default="5,9,17,24,33,40,52,64", help="the prompts' lengths")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--size", default="small")
    parser.add_argument("--draw", action="store_true", help="only draw the figure of an existing --out")
    args = parser.parse_args()
    if args.draw:
        with args.out.open() as file:
            rows = [{key: value if key in ("arch", "variant", "size", "side", "prompt_lengths") else float(value)
                     for key, value in row.items()} for row in csv.DictReader(file)]
        draw(rows, args.out.with_suffix(".png"))
        return
    torch.set_num_threads(args.threads)
    lengths = [int(length) for length in args.lengths.split(",")]
    rows = []
    for name in ARCHITECTURES:
        torch.manual_seed(0)
        with initialize_config_module("mcsd.conf", version_base="1.3"):
            source = resolve(name, args.size)
            variant, node = source.variant, source.node
        model = mcsd.build_model(node).eval()
        hf_model = as_hf_model(model, eos_token_id=0).eval()
        hf_model.generation_config.eos_token_id = None  # every row decodes every token
        prompts = [torch.randint(1, model.config.vocab_size, (length,)) for length in lengths]
        with torch.inference_mode():
            alone = row_by_row(hf_model, prompts, args.tokens)
            for side in ("left", "right"):
                ids, mask = padded(prompts, side)
                assert torch.equal(batched(hf_model, ids, mask, args.tokens), alone), side  # the same tokens
                seconds: dict[str, list[float]] = {"row_by_row": [], "batched": []}
                for _ in range(args.repeats):
                    for way in ("row_by_row", "batched"):
                        start = time.perf_counter()
                        if way == "batched":
                            batched(hf_model, ids, mask, args.tokens)
                        else:
                            row_by_row(hf_model, prompts, args.tokens)
                        seconds[way].append(time.perf_counter() - start)
                new_tokens = len(prompts) * args.tokens
                rate = {way: new_tokens / statistics.median(times) for way, times in seconds.items()}
                spread = {way: round(max(times) / min(times), 3) for way, times in seconds.items()}
                rows.append({"arch": name, "variant": variant, "size": args.size, "side": side,
                             "prompts": len(prompts), "prompt_lengths": "-".join(map(str, lengths)),
                             "tokens": args.tokens, "threads": args.threads, "repeats": args.repeats,
                             "row_by_row_tokens_per_s": round(rate["row_by_row"], 1),
                             "batched_tokens_per_s": round(rate["batched"], 1),
                             "speedup": round(rate["batched"] / rate["row_by_row"], 3),
                             "row_by_row_max_over_min": spread["row_by_row"], "batched_max_over_min": spread["batched"]})
                print(rows[-1], flush=True)
    write_rows(rows, args.out)
    draw(rows, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
