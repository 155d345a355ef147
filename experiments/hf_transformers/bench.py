"""Batch-1 greedy decoding of N tokens at size=small: Hugging Face ``generate`` on the exported
model class vs the project's own decoding (what ``mcsd-generate temperature=0`` runs:
``CausalLM.stream``), both eager, side by side in one process, alternating, medians over repeats.

    python experiments/hf_transformers/bench.py --out experiments/hf_transformers/results.csv
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import torch
from hydra import initialize_config_module
from tqdm import tqdm

import mcsd
from mcsd.checkpoint.model_source import resolve
from mcsd.hf import as_hf_model
from mcsd.models import registry


def decode_project(model: mcsd.CausalLM, prompt: torch.Tensor, tokens: int) -> list[int]:
    return [int(token) for token in model.stream(prompt, tokens, temperature=0.0)]


def decode_hf(hf_model, prompt: torch.Tensor, tokens: int) -> list[int]:
    output = hf_model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=tokens, do_sample=False)
    return output[0, prompt.shape[1]:].tolist()


def write_rows(rows: list[dict], out: Path) -> None:
    """``rows`` as a CSV file at ``out`` (its folder made if needed)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name in tqdm(registry.architectures(), desc="architectures"):
        torch.manual_seed(0)
        with initialize_config_module("mcsd.conf", version_base="1.3"):
            source = resolve(name, "small")
            variant, node = source.variant, source.node
        model = mcsd.build_model(node).eval()
        hf_model = as_hf_model(model, eos_token_id=0).eval()
        hf_model.generation_config.eos_token_id = None  # decode every token, as the project's side does
        prompt = torch.randint(1, model.config.vocab_size, (1, args.prompt))
        with torch.inference_mode():
            assert decode_project(model, prompt, 32) == decode_hf(hf_model, prompt, 32)  # same tokens
            seconds: dict[str, list[float]] = {"mcsd": [], "hf": []}
            for _ in range(args.repeats):
                for side, decode in (("mcsd", decode_project), ("hf", decode_hf)):
                    start = time.perf_counter()
                    decode(model if side == "mcsd" else hf_model, prompt, args.tokens)
                    seconds[side].append(time.perf_counter() - start)
        mcsd_rate, hf_rate = (args.tokens / statistics.median(seconds[side]) for side in ("mcsd", "hf"))
        rows.append({"arch": name, "variant": variant, "params": sum(p.numel() for p in model.parameters()),
                     "tokens": args.tokens, "prompt": args.prompt, "threads": args.threads, "repeats": args.repeats,
                     "mcsd_tokens_per_s": round(mcsd_rate, 1), "hf_tokens_per_s": round(hf_rate, 1),
                     "hf_over_mcsd_time": round(mcsd_rate / hf_rate, 3)})
        print(rows[-1], flush=True)
    write_rows(rows, args.out)


if __name__ == "__main__":
    main()
