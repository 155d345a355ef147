"""The LightningDataModules of text: corpus -> tokenizer -> token shards -> blocks -> splits.

Each split's documents are tokenized once, streamed, into memory-mapped token shards under
``cache_dir/<corpus fingerprint>/`` (:mod:`mcsd.data.tokens`), each document after
``<|endoftext|>`` (as lm-eval scores a text: from an ``<|endoftext|>`` prefix); training reads
blocks of ``seq_len + 1`` tokens (inputs and shifted targets) from them lazily. Validation and
test are whole documents: a corpus's own splits where the config names them, else documents held
out of the training split, drawn from ``seed``. The train loader is a ``torchdata``
``StatefulDataLoader`` whose order is a function of ``(seed, epoch)``: Lightning saves its
position in checkpoints, so a resumed run sees the same batches, in this epoch and every later one.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from filelock import FileLock
from tokenizers import Tokenizer
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from mcsd.data.corpus import (
    DataError,
    DocumentSource,
    digest,
    embedded_corpus,
    hub_dataset,
    plain_paths,
    text_files,
)
from mcsd.data.tokenizer import eos_id, load_tokenizer, train_tokenizer
from mcsd.data.tokens import DOCUMENTS, PackedBlocks, TokenStore, open_or_build

log = logging.getLogger(__name__)
SOURCES = ("embedded", "text_files", "hub")
HELD_OUT = ("val", "test")
# A corpus's own val/test documents are compared with the training documents, token for token,
# when training has at most this many tokens (beyond, only the same files or splits are caught).
OVERLAP_CHECK_TOKENS = 1 << 27


class EpochShuffleSampler(StatefulDistributedSampler):
    """Pass ``k`` over the data is in the order ``DistributedSampler`` draws from
    ``(seed, k)``; the checkpointed state is the pass and the samples yielded in it.

    The sampler counts its own passes (a new one starts once the previous one yielded
    every sample that whole batches of ``batch_size`` use) and ignores ``set_epoch``:
    Lightning's epoch number is no key to the data stream of a resumed run (resumed from a
    checkpoint taken on an epoch's last batch, it starts its next epoch without iterating
    the one it counted in between), and the loader rebuilds its iterator as soon as its
    state is loaded, before any ``set_epoch``.

    A dataset with ``fresh_each_pass = True`` (new examples every pass: MQAR's
    ``fresh_examples``) is given ``pass * len(dataset) + index``, which pass as well as which
    example of it, so that a resumed run reads the examples the uninterrupted one read.
    """

    def __init__(self, *args: Any, batch_size: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.used_per_pass = self.num_samples // batch_size * batch_size  # the last partial batch is dropped
        self.pass_offset = bool(getattr(self.dataset, "fresh_each_pass", False))

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

    def _pass(self, start: int, chunk: int = 8192) -> Iterator[int]:
        """``DistributedSampler``'s order for this pass (the same permutation) from ``start``,
        held as one tensor rather than its Python lists: 8 bytes a block, not ~100, which
        matters for corpora of millions of blocks."""
        size = len(self.dataset)  # type: ignore[arg-type]
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(size, generator=generator)
        else:
            order = torch.arange(size)
        if not self.drop_last and self.total_size > size:  # padded by repeating the order, as DistributedSampler
            order = order.repeat(math.ceil(self.total_size / size))
        mine = order[: self.total_size][self.rank :: self.num_replicas].numpy()
        if self.pass_offset:
            mine = mine + self.epoch * size
        for begin in range(start, len(mine), chunk):
            for index in mine[begin : begin + chunk].tolist():
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


def tokens_per_step(data: Any, accumulate_grad_batches: int, processes: int) -> int:
    """The tokens one optimiser step trains on: ``data.batch_size`` blocks of ``data.seq_len``
    per process and micro-batch (what ``data.token_budget`` is divided by)."""
    return data.batch_size * data.seq_len * accumulate_grad_batches * processes


def corpus_sources(data: Mapping[str, Any], hf_cache: Path) -> dict[str, DocumentSource]:
    """The splits of documents a data config names (``train``, and ``val``/``test`` where the
    corpus has its own), by its ``source`` and that source's fields (the defaults of
    :class:`LanguageModelDataModule` for those it lacks). Nothing is read yet."""
    source = data.get("source", "embedded")
    if source == "embedded":
        return embedded_corpus()
    text_field = data.get("text_field") or "text"
    if source == "text_files":
        return text_files(data.get("paths"), text_field, data.get("sample_by", "auto"), hf_cache)
    if source != "hub":
        raise DataError(f"data.source={source!r} is unknown: use one of {', '.join(SOURCES)}")
    return hub_dataset(data.get("name", "hub"), data.get("hub_path"), data.get("hub_subset"),
                       dict(data.get("splits") or {"train": "train"}), text_field, data.get("max_documents"),
                       data.get("streaming", False), hf_cache)


def _sample(source: DocumentSource, max_bytes: int) -> Iterator[str]:
    """The first documents of ``source``, up to ``max_bytes`` of UTF-8 text in all (at least one)."""
    seen = 0
    for text in itertools.chain.from_iterable(source.documents()):
        size = len(text.encode())
        if seen and seen + size > max_bytes:
            return
        seen += size
        yield text


def hold_out(lengths: np.ndarray, seed: int, wanted: Mapping[str, tuple[float, int | None]]) -> dict[str, np.ndarray]:
    """Whole documents for each held-out split in ``wanted`` (name: (fraction of the tokens,
    or a count of documents)), drawn in the order of a permutation from ``seed``; ``train`` is
    the rest. Each list in corpus order."""
    order = np.random.default_rng(seed).permutation(len(lengths))
    total_before = np.concatenate([[0], np.cumsum(lengths[order])])
    chosen, position = {}, 0
    for split, (fraction, count) in wanted.items():
        if count is None:
            target = total_before[position] + fraction * total_before[-1]
            count = max(1, int(np.searchsorted(total_before, target, side="left")) - position)
        chosen[split] = np.sort(order[position:position + count])
        position += count
    chosen["train"] = np.sort(order[position:])
    return chosen


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
    - ``text_files``: ``paths`` of local .txt/.jsonl/.json/.parquet files (a list, or a mapping
      of ``train``/``val``/``test`` to lists);
    - ``hub``: ``load_dataset(hub_path, hub_subset, split=...)`` for each split ``splits`` names.
    """

    def __init__(
        self,
        source: str = "embedded",
        name: str = "embedded",
        paths: list[str] | Mapping[str, list[str]] | None = None,
        sample_by: str = "auto",
        hub_path: str | None = None,
        hub_subset: str | None = None,
        splits: Mapping[str, str | None] | None = None,
        streaming: bool = False,
        max_documents: int | None = None,
        text_field: str = "text",
        separate_documents: bool = True,
        documents: str = "joined",
        tokenizer_path: str | None = None,
        tokenizer_sample_bytes: int = 100_000_000,
        vocab_size: int = 4096,
        seq_len: int = 256,
        batch_size: int = 16,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        val_documents: int | None = None,
        test_documents: int | None = None,
        seed: int = 0,
        cache_dir: str = "logs/cache",
        num_proc: int | None = None,
        shard_tokens: int = 1 << 28,
        verify_shards: bool = True,
        num_workers: int = 0,
        token_budget: int | None = None,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        """``tokenizer``: the tokenizer of the weights a run starts from (fine-tuning, resuming),
        used instead of ``tokenizer_path`` or a BPE trained on this corpus."""
        super().__init__()
        if source not in SOURCES:
            raise DataError(f"data.source={source!r} is unknown: use one of {', '.join(SOURCES)}")
        for field, value in (("seq_len", seq_len), ("batch_size", batch_size), ("vocab_size", vocab_size),
                             ("tokenizer_sample_bytes", tokenizer_sample_bytes), ("shard_tokens", shard_tokens)):
            if not isinstance(value, int) or value < 1:
                raise DataError(f"data.{field}={value!r} must be a positive integer")
        if num_proc is not None and (not isinstance(num_proc, int) or num_proc < 1):
            raise DataError(f"data.num_proc={num_proc!r} must be a positive number of processes (or null: one per "
                            "CPU core)")
        if not (0 < val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
            raise DataError(f"data.val_fraction={val_fraction} and data.test_fraction={test_fraction} must be "
                            "fractions in [0, 1) that leave room for training (val_fraction > 0)")
        for field, value in (("val_documents", val_documents), ("test_documents", test_documents)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise DataError(f"data.{field}={value!r} must be a positive number of documents (or null: "
                                f"data.{field.split('_')[0]}_fraction)")
        if documents not in DOCUMENTS:
            raise DataError(f"data.documents={documents!r} is unknown: use joined (a block's documents run on into "
                            "each other) or apart (each block says where its documents start: position_ids)")
        if token_budget is not None and token_budget < 1:
            raise DataError(f"data.token_budget={token_budget} must be a positive number of tokens (or null)")
        paths = plain_paths(paths)  # plain types only: checkpoints load with weights_only=True
        splits = {str(split): None if name is None else str(name) for split, name in splits.items()} if splits \
            else None
        self.save_hyperparameters(ignore=["tokenizer"], logger=False)
        self.given_tokenizer = tokenizer
        self.tokenizer: Tokenizer | None = None
        self.splits: dict[str, PackedBlocks] = {}
        self.held_out: list[str] = []

    # -- building (cached) ------------------------------------------------------------

    def build(self) -> dict[str, PackedBlocks]:
        """Load or make the tokenizer and each split's token shards (cached; an unfinished
        build goes on where it stopped), then the blocks of each split."""
        h = self.hparams
        cache_root = Path(h.cache_dir).expanduser()
        sources = corpus_sources(self.hparams, cache_root / "hf")
        corpus = sources["train"].fingerprint if len(sources) == 1 else \
            sources["train"].fingerprint.split("-")[0] + "-" + digest(*(f"{k}={v.fingerprint}" for k, v in
                                                                         sorted(sources.items())))
        for split, source in sources.items():
            if split != "train" and source.fingerprint == sources["train"].fingerprint:
                raise DataError(self._overlap(split, "is the training data itself"))
        cache = cache_root / corpus
        made = not cache.exists()
        cache.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(str(cache / "build.lock")):  # runs sharing a cache build it once, one after another
                self.tokenizer = self._tokenizer(sources["train"], cache)
                separator = eos_id(self.tokenizer) if h.separate_documents else None
                tokens = cache / f"tokens-{digest(self.tokenizer.to_str())}-{'eos' if separator is not None else 'joined'}"
                num_proc = h.num_proc or len(os.sched_getaffinity(0))
                stores = {split: open_or_build(source, tokens / split, self.tokenizer, separator, num_proc,
                                               h.verify_shards, h.shard_tokens) for split, source in sources.items()}
            self._check_no_overlap(stores)
            self.splits = self._blocks(stores)
        except DataError:
            if made:  # a corpus refused leaves no cache folder (an interrupted build keeps its for next time)
                shutil.rmtree(cache, ignore_errors=True)
            raise
        return self.splits

    def _overlap(self, split: str, what: str) -> str:
        return (f"data={self.hparams.name}: the {split} split {what}: it would measure what training memorised, not "
                f"held-out text; name {split} documents that training does not read (data.paths.{split}), or drop "
                f"the {split} split to hold documents out of training")

    def _check_no_overlap(self, stores: dict[str, TokenStore]) -> None:
        """A corpus's own val/test documents that are all training documents too are refused;
        some of them, a warning."""
        train = stores["train"]
        if train.tokens > OVERLAP_CHECK_TOKENS:
            return
        for split, store in stores.items():
            shared = train.shared_documents(store) if split != "train" and store.documents else 0
            if shared and shared == store.documents:
                raise DataError(self._overlap(split, f"holds only training documents ({shared} of {shared})"))
            if shared:
                log.warning("data=%s: %d of the %d %s documents are training documents too: they measure memorisation",
                            self.hparams.name, shared, store.documents, split)

    def _tokenizer(self, train: DocumentSource, cache: Path) -> Tokenizer:
        """The tokenizer given (the weights'), ``tokenizer_path``'s, or a BPE trained on the first
        ``tokenizer_sample_bytes`` of the training documents (cached)."""
        h = self.hparams
        if self.given_tokenizer is not None:
            tokenizer = self.given_tokenizer
        elif h.tokenizer_path:
            tokenizer = load_tokenizer(h.tokenizer_path)
        else:
            path = cache / f"tokenizer-{h.vocab_size}-{h.tokenizer_sample_bytes}.json"
            if path.is_file():
                tokenizer = Tokenizer.from_file(str(path))
            else:
                log.info("training a %d-token byte-level BPE on the first %d bytes of %s", h.vocab_size,
                         h.tokenizer_sample_bytes, train.description)
                tokenizer = train_tokenizer(_sample(train, h.tokenizer_sample_bytes), h.vocab_size)
                temporary = path.with_name(f".{path.name}.tmp")
                tokenizer.save(str(temporary))
                os.replace(temporary, path)
        if tokenizer.get_vocab_size() > h.vocab_size:
            raise DataError(f"the tokenizer has {tokenizer.get_vocab_size()} tokens but model.vocab_size="
                            f"{h.vocab_size}: raise model.vocab_size or use a smaller tokenizer")
        return tokenizer

    def _blocks(self, stores: dict[str, TokenStore]) -> dict[str, PackedBlocks]:
        """Each split's blocks: its own store's documents, or whole documents held out of
        the training store (``*_fraction`` of its tokens or ``*_documents``, drawn from ``seed``)."""
        h = self.hparams
        train = stores["train"]
        wanted = {split: (h[f"{split}_fraction"], h[f"{split}_documents"]) for split in HELD_OUT
                  if split not in stores and (h[f"{split}_fraction"] > 0 or h[f"{split}_documents"])}
        needed = 1 + sum(count or 1 for _, count in wanted.values())
        if train.documents < needed:
            raise DataError(
                f"data={h.name}: the corpus has {train.documents} document(s), but validation and test are whole "
                f"documents held out of training, so it needs at least {needed}: give more files, cut .txt files "
                "into documents (data.sample_by=paragraph or line), or name held-out files "
                "(data.paths={train:[...],val:[...],test:[...]})")
        chosen = hold_out(train.lengths, h.seed, wanted)
        self.held_out = [split for split in chosen if split != "train"]
        if len(chosen["train"]) == 0:
            raise DataError(f"data={h.name}: holding out {', '.join(wanted)} leaves no training document: lower "
                            "data.val_fraction / data.test_fraction (or *_documents)")
        block, apart = h.seq_len + 1, h.get("documents", "joined") == "apart"
        splits = {split: PackedBlocks(train, documents, block, apart) for split, documents in chosen.items()}
        splits |= {split: PackedBlocks(store, np.arange(store.documents), block, apart)
                   for split, store in stores.items() if split != "train"}
        splits.setdefault("test", PackedBlocks(train, np.zeros(0, np.int64), block, apart))  # test_fraction=0: none
        for split in ("train", "val", *(["test"] if splits["test"].documents else [])):
            if len(splits[split]) == 0:
                raise DataError(
                    f"data.seq_len={h.seq_len} is too long for this corpus: its {split} documents "
                    f"({splits[split].tokens} tokens) make no block of {block} tokens; lower data.seq_len"
                    + ("" if split == "train" or split in stores else f" or raise data.{split}_fraction"))
        return {split: splits[split] for split in ("train", "val", "test")}

    def describe(self) -> dict[str, Any]:
        """Sizes for logs: tokens (in blocks) and documents per split, and whether a split's documents
        are held out of the training documents (or the corpus's own)."""
        return {**super().describe(),
                **{f"data/{name}_documents": split.documents for name, split in self.splits.items()},
                **{f"data/{name}_held_out": name in self.held_out for name in self.splits if name != "train"},
                "data/tokenizer": ("the weights'" if self.given_tokenizer is not None else
                                   self.hparams.tokenizer_path or "trained on the corpus")}
