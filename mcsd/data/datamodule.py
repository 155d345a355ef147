"""The LightningDataModule: corpus -> tokenizer -> tokens -> packed blocks -> splits.

Documents are tokenized with ``datasets.map`` (cached as Arrow files), each preceded by
``<|endoftext|>`` (as lm-eval scores a text: from an ``<|endoftext|>`` prefix), and packed
into blocks of ``seq_len + 1`` tokens (inputs and shifted targets). Blocks are split into train/val/test by a permutation drawn from ``seed``, so a
corpus of one long document splits as well as one of many. Everything derived is cached
under ``cache_dir/<corpus fingerprint>/``: the tokenizer (``tokenizer-<vocab>.json``), the
token and block files. The train loader is a ``torchdata`` ``StatefulDataLoader`` whose
order is a function of ``(seed, epoch)``: Lightning saves its position in checkpoints, so a
resumed run sees the same batches, in this epoch and every later one.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import datasets
import lightning as L
import numpy as np
from filelock import FileLock
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from mcsd.data.corpus import DataError, embedded_corpus, hub_dataset, text_files
from mcsd.data.tokenizer import eos_id, load_tokenizer, train_tokenizer

log = logging.getLogger(__name__)
SOURCES = ("embedded", "text_files", "hub")


class EpochShuffleSampler(StatefulDistributedSampler):
    """Pass ``k`` over the data is in the order ``DistributedSampler`` draws from
    ``(seed, k)``; the checkpointed state is the pass and the samples yielded in it.

    The sampler counts its own passes (a new one starts once the previous one yielded
    every sample that whole batches of ``batch_size`` use) and ignores ``set_epoch``:
    Lightning's epoch number is no key to the data stream of a resumed run (resumed from a
    checkpoint taken on an epoch's last batch, it starts its next epoch without iterating
    the one it counted in between), and the loader rebuilds its iterator as soon as its
    state is loaded, before any ``set_epoch``.
    """

    def __init__(self, *args: Any, batch_size: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.used_per_pass = self.num_samples // batch_size * batch_size  # the last partial batch is dropped

    def set_epoch(self, epoch: int) -> None:
        """Ignored: see the class docstring."""

    def __iter__(self) -> Iterator[int]:
        """Continue the restored pass, or start the next one if the last is complete (decided
        when the iterator is made, not when it is first read)."""
        if self.next_yielded is not None:
            start, self.next_yielded = self.next_yielded, None
        else:
            if self.yielded >= self.used_per_pass:
                self.epoch += 1
            start = 0
        self.yielded = start
        return self._pass(start)

    def _pass(self, start: int) -> Iterator[int]:
        for index in itertools.islice(DistributedSampler.__iter__(self), start, None):
            self.yielded += 1
            yield index

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "epoch": self.epoch, "num_replicas": self.num_replicas}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Also across a change in the number of processes (a sharded run resumed on one, ...):
        the samples yielded so far in the pass, counted per process, are rescaled, so that the
        pass goes on where the whole batch left it (the global batch must stay the same)."""
        saved = state_dict.get("num_replicas", self.num_replicas)
        if saved != self.num_replicas:
            state_dict = {**state_dict, "yielded": state_dict["yielded"] * saved // self.num_replicas}
        super().load_state_dict(state_dict)
        self.epoch = state_dict["epoch"]


def load_corpus(data: Mapping[str, Any], hf_cache: Path) -> tuple[datasets.Dataset, str]:
    """The documents (a ``text`` column) and a fingerprint of the corpus a data config names
    (its ``source`` and that source's fields; the defaults of :class:`LanguageModelDataModule`
    for those it lacks)."""
    source = data.get("source", "embedded")
    if source == "embedded":
        return embedded_corpus()
    text_field = data.get("text_field") or "text"
    if source == "text_files":
        return text_files([str(path) for path in data.get("paths") or []], text_field, hf_cache)
    if source != "hub":
        raise DataError(f"data.source={source!r} is unknown: use one of {', '.join(SOURCES)}")
    return hub_dataset(data.get("name", "hub"), data.get("hub_path"), data.get("hub_subset"),
                       data.get("hub_split", "train"), text_field, data.get("max_documents"),
                       data.get("streaming", False), hf_cache)


class SplitsDataModule(L.LightningDataModule):
    """The Lightning hooks of a datamodule whose ``build()`` fills ``self.splits`` (``train``,
    ``val``, ``test`` datasets) once; its hyperparameters name ``batch_size``, ``seed``,
    ``num_workers`` and ``seq_len``."""

    splits: dict[str, Any]

    def build(self) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__qualname__} must build its splits")

    def prepare_data(self) -> None:
        if not self.splits:
            self.build()

    def setup(self, stage: str | None = None) -> None:
        if not self.splits:
            self.build()

    def describe(self) -> dict[str, Any]:
        """Sizes for logs: tokens per split."""
        return {f"data/{name}_tokens": len(split) * self.hparams.seq_len for name, split in self.splits.items()}

    def train_dataloader(self) -> StatefulDataLoader:
        """Batches in an order that is a function of ``(seed, epoch)`` alone, split over the
        processes of a distributed run; the epoch and the position within it are in every
        checkpoint, so a resumed run sees the batches the uninterrupted one would."""
        trainer, h = self.trainer, self.hparams
        sampler = EpochShuffleSampler(
            self.splits["train"], num_replicas=trainer.world_size if trainer else 1,
            rank=trainer.global_rank if trainer else 0, shuffle=True, seed=h.seed, drop_last=True,
            batch_size=h.batch_size,
        )
        return StatefulDataLoader(self.splits["train"], batch_size=h.batch_size, sampler=sampler, drop_last=True,
                                  num_workers=h.num_workers)

    def _eval_loader(self, split: str) -> DataLoader:
        return DataLoader(self.splits[split], batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")


class LanguageModelDataModule(SplitsDataModule):
    """Token blocks for next-token prediction from one of three ``source``\\ s:

    - ``embedded``: CPython's ``pydoc_data`` topics (no network);
    - ``text_files``: ``paths`` of local .txt/.jsonl/.json/.parquet files;
    - ``hub``: ``load_dataset(hub_path, hub_subset, split=hub_split)``.
    """

    def __init__(
        self,
        source: str = "embedded",
        name: str = "embedded",
        paths: list[str] | None = None,
        hub_path: str | None = None,
        hub_subset: str | None = None,
        hub_split: str = "train",
        streaming: bool = False,
        max_documents: int | None = None,
        text_field: str = "text",
        separate_documents: bool = True,
        tokenizer_path: str | None = None,
        vocab_size: int = 4096,
        seq_len: int = 256,
        batch_size: int = 16,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        seed: int = 0,
        cache_dir: str = "logs/cache",
        num_workers: int = 0,
        token_budget: int | None = None,
    ) -> None:
        super().__init__()
        if source not in SOURCES:
            raise DataError(f"data.source={source!r} is unknown: use one of {', '.join(SOURCES)}")
        for field, value in (("seq_len", seq_len), ("batch_size", batch_size), ("vocab_size", vocab_size)):
            if not isinstance(value, int) or value < 1:
                raise DataError(f"data.{field}={value!r} must be a positive integer")
        if not (0 < val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
            raise DataError(f"data.val_fraction={val_fraction} and data.test_fraction={test_fraction} must be "
                            "fractions in [0, 1) that leave room for training (val_fraction > 0)")
        if token_budget is not None and token_budget < 1:
            raise DataError(f"data.token_budget={token_budget} must be a positive number of tokens (or null)")
        # Plain types only (an OmegaConf list is refused by weights-only checkpoint loading).
        paths = [str(path) for path in paths] if paths is not None else None
        self.save_hyperparameters(logger=False)
        self.tokenizer: Tokenizer | None = None
        self.splits: dict[str, datasets.Dataset] = {}

    # -- building (cached) ------------------------------------------------------------

    def build(self) -> dict[str, datasets.Dataset]:
        """Load or make the tokenizer and the packed splits (idempotent, cached)."""
        h = self.hparams
        cache_root = Path(h.cache_dir).expanduser()
        corpus, fingerprint = load_corpus(self.hparams, cache_root / "hf")
        corpus = corpus.filter(lambda row: bool(row["text"] and row["text"].strip()), desc="dropping empty documents")
        if len(corpus) == 0:
            raise DataError(f"data={h.name}: the corpus has no text (every document is empty): give it files with text")
        cache = cache_root / fingerprint
        cache.mkdir(parents=True, exist_ok=True)
        with FileLock(str(cache / "build.lock")):  # runs sharing a cache build it once, one after another
            return self._build_cached(corpus, cache)

    def _build_cached(self, corpus: datasets.Dataset, cache: Path) -> dict[str, datasets.Dataset]:
        h = self.hparams
        if h.tokenizer_path:
            self.tokenizer = load_tokenizer(h.tokenizer_path)
            tokenizer_file = cache / f"tokenizer-{Path(h.tokenizer_path).name}.json"
            self.tokenizer.save(str(tokenizer_file))
        else:
            tokenizer_file = cache / f"tokenizer-{h.vocab_size}.json"
            if tokenizer_file.is_file():
                self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
            else:
                log.info("training a %d-token byte-level BPE on %d documents", h.vocab_size, len(corpus))
                self.tokenizer = train_tokenizer((row["text"] for row in corpus), h.vocab_size)
                self.tokenizer.save(str(tokenizer_file))
        if self.tokenizer.get_vocab_size() > h.vocab_size:
            raise DataError(f"the tokenizer has {self.tokenizer.get_vocab_size()} tokens but model.vocab_size="
                            f"{h.vocab_size}: raise model.vocab_size or use a smaller tokenizer")
        separator = [eos_id(self.tokenizer)] if h.separate_documents else []
        tag = f"{tokenizer_file.stem}-{'eos-first' if separator else 'joined'}"
        tokenizer = self.tokenizer

        def encode(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
            return {"ids": [separator + encoding.ids for encoding in tokenizer.encode_batch(batch["text"])]}

        tokens = corpus.map(encode, batched=True, remove_columns=["text"], desc="tokenizing",
                            cache_file_name=str(cache / f"tokens-{tag}.arrow"), new_fingerprint=f"tokens-{tag}")
        total = sum(len(ids) for ids in tokens["ids"])
        block = h.seq_len + 1

        def pack(batch: dict[str, list[list[int]]]) -> dict[str, list[list[int]]]:
            flat = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in batch["ids"]])
            usable = len(flat) // block * block
            return {"input_ids": flat[:usable].reshape(-1, block).tolist()}

        # One map batch packs the whole corpus into blocks (nothing dropped between batches).
        blocks = tokens.map(pack, batched=True, batch_size=len(tokens), remove_columns=["ids"], desc="packing",
                            cache_file_name=str(cache / f"blocks-{tag}-{block}.arrow"),
                            new_fingerprint=f"blocks-{tag}-{block}")
        num_val = max(1, round(len(blocks) * h.val_fraction))
        num_test = max(1, round(len(blocks) * h.test_fraction)) if h.test_fraction > 0 else 0
        if len(blocks) < num_val + num_test + 1:
            raise DataError(
                f"data.seq_len={h.seq_len} is too long for this corpus: its {total} tokens make {len(blocks)} blocks "
                f"of {block}, fewer than the {num_val + num_test + 1} that train/val/test need; lower data.seq_len"
            )
        order = np.random.default_rng(h.seed).permutation(len(blocks))
        self.splits = {
            "val": blocks.select(order[:num_val]),
            "test": blocks.select(order[num_val : num_val + num_test]),
            "train": blocks.select(order[num_val + num_test :]),
        }
        for split in self.splits.values():
            split.set_format("torch", columns=["input_ids"])
        return self.splits

