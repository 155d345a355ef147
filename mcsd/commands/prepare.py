"""mcsd-prepare: tokenize a corpus into its cache once, for the training runs that follow.

    mcsd-prepare data=fineweb_edu data.max_documents=null model.vocab_size=50304 paths.cache_dir=/scratch/mcsd-cache

Takes mcsd-train's data settings (``data=``, ``data.*``, ``model.vocab_size``, ``paths.cache_dir``,
``seed`` for the held-out documents); prints where the shards are and each split's size.
"""

from __future__ import annotations

from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig

from mcsd.commands.app import hydra_app


def prepare(cfg: DictConfig) -> dict[str, Any]:
    """Build (or find) the data of ``cfg.data``; return and print each split's documents, tokens and blocks."""
    datamodule = instantiate(cfg.data)
    splits = datamodule.build()
    report = {"cache": str(splits["train"].store.folder.parent)}
    print(f"token shards: {report['cache']}")
    for name, split in splits.items():
        report[name] = {"documents": split.documents, "tokens": split.tokens, "blocks": len(split)}
        print(f"{name}: {split.documents:,} documents, {split.tokens:,} tokens, {len(split):,} blocks of "
              f"{split.block} tokens")
    return report


@hydra_app("mcsd-prepare", "prepare")
def main(cfg: DictConfig) -> None:
    """Entry point of ``mcsd-prepare``."""
    prepare(cfg)


if __name__ == "__main__":
    main()
