"""A large local corpus made from the embedded documents (CPython's pydoc topics): JSONL files of
documents, each a random run of 3-30 of the topics' paragraphs, shuffled from a seed, until the
files hold SIZE bytes of text.
    python make_corpus.py OUT_DIR SIZE_BYTES [--files N] [--seed S]
"""
import argparse
import json
from pathlib import Path

import numpy as np
from pydoc_data.topics import topics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("size", type=float, help="bytes of text in all (e.g. 2e9)")
    parser.add_argument("--files", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    paragraphs = [part for name in sorted(topics) for part in topics[name].split("\n\n") if part.strip()]
    rng = np.random.default_rng(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    per_file, written = args.size / args.files, 0
    for number in range(args.files):
        with (args.out / f"part-{number:03d}.jsonl").open("w") as handle:
            while written < per_file * (number + 1):
                chosen = rng.integers(len(paragraphs), size=int(rng.integers(3, 31)))
                text = "\n\n".join(paragraphs[index] for index in chosen)
                handle.write(json.dumps({"text": text}) + "\n")
                written += len(text.encode())
    print(f"{args.out}: {written / 1e6:.0f} MB of text in {args.files} file(s)")


if __name__ == "__main__":
    main()
