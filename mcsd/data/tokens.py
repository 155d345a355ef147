"""Token shards: a split's documents tokenized once into memory-mapped files, read lazily.

A *token store* is a folder of shards (``00000.bin``: the tokens of whole documents, each after
its separator, as ``uint16`` when the vocabulary fits, else ``uint32``; ``00000.json``: its
document lengths' file, token count and CRC-32) and ``index.json``, written last: a folder
without it is an unfinished build, whose complete shards a new build keeps and goes on after.
Documents are streamed, encoded in batches by ``num_proc`` worker processes (single-threaded
``tokenizers`` each) and written in order, so memory stays bounded whatever the corpus size.

:class:`PackedBlocks` reads blocks of ``seq_len + 1`` tokens out of a chosen set of documents
(their tokens in corpus order, concatenated) without loading them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import zlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from tqdm.auto import tqdm

from mcsd.data.corpus import DataError, DocumentSource, digest

log = logging.getLogger(__name__)
FORMAT = 1
INDEX_FILE = "index.json"
CRC_CHUNK_BYTES = 1 << 24
# data.documents: a block's documents run on into each other (joined), or each token says its position
# in its own document and nothing crosses a document's start (apart: PackedBlocks's position_ids).
DOCUMENTS = ("joined", "apart")


@dataclass(frozen=True)
class StoreKey:
    """What a store was built from: a store is read only by a run whose key is the same."""

    source: str  # the split's fingerprint (corpus.DocumentSource.fingerprint)
    tokenizer: str  # digest of the tokenizer's JSON
    vocab_size: int
    separator: int | None  # the id written before every document, or None (documents joined)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.uint32)


def store_key(source: DocumentSource, tokenizer: Tokenizer, separator: int | None) -> StoreKey:
    return StoreKey(source.fingerprint, digest(tokenizer.to_str()), tokenizer.get_vocab_size(), separator)


class TokenStore:
    """A built store: every document's length and place, and its shards memory-mapped on first use."""

    def __init__(self, folder: Path, index: dict[str, Any], lengths: list[np.ndarray]) -> None:
        self.folder = folder
        self.index = index
        self.dtype = np.dtype(index["dtype"])
        self.lengths = np.concatenate(lengths).astype(np.int64) if lengths else np.zeros(0, np.int64)
        self.shard_of = np.repeat(np.arange(len(lengths)), [len(part) for part in lengths])
        starts = [np.concatenate([[0], np.cumsum(part[:-1], dtype=np.int64)]) for part in lengths if len(part)]
        self.start_in_shard = np.concatenate(starts) if starts else np.zeros(0, np.int64)
        self._shards: dict[int, np.memmap] = {}

    @property
    def documents(self) -> int:
        return len(self.lengths)

    @property
    def tokens(self) -> int:
        return int(self.index["tokens"])

    def shard(self, number: int) -> np.memmap:
        if number not in self._shards:
            self._shards[number] = np.memmap(self.folder / self.index["shards"][number]["file"], dtype=self.dtype,
                                             mode="r")
        return self._shards[number]

    def document(self, number: int) -> np.ndarray:
        """The tokens of document ``number`` (its separator first)."""
        start = self.start_in_shard[number]
        return np.asarray(self.shard(int(self.shard_of[number]))[start:start + self.lengths[number]])

    def shared_documents(self, other: TokenStore) -> int:
        """How many of ``other``'s documents are also documents of this store, token for token
        (only documents of a length ``other`` has are read here)."""
        def key(store: TokenStore, number: int) -> bytes:
            return hashlib.blake2b(store.document(number).tobytes(), digest_size=16).digest()

        theirs = [key(other, number) for number in range(other.documents)]
        lengths = set(other.lengths.tolist())
        mine = {key(self, number) for number in np.flatnonzero(np.isin(self.lengths, list(lengths)))}
        return sum(1 for digest in theirs if digest in mine)

    def __getstate__(self) -> dict[str, Any]:  # to DataLoader workers: maps are opened again there
        return {**self.__dict__, "_shards": {}}

    @classmethod
    def open(cls, folder: Path, key: StoreKey, verify: bool = True) -> TokenStore:
        """The store in ``folder``, checked against ``key``, each shard's size and (``verify``) CRC-32."""
        try:
            index = json.loads((folder / INDEX_FILE).read_text())
            built = StoreKey(**index["key"])
        except (ValueError, KeyError, TypeError) as error:
            raise DataError(f"the token cache index {folder / INDEX_FILE} is unreadable ({type(error).__name__}): "
                            f"delete {folder} to build it again") from None
        if built != key:
            what = next(field for field in ("source", "tokenizer", "vocab_size", "separator")
                        if getattr(built, field) != getattr(key, field))
            raise DataError(f"the token cache {folder} was built with another {what.replace('_', ' ')} "
                            f"({getattr(built, what)!r}, this run: {getattr(key, what)!r}): delete the folder to "
                            "build it again for this run")
        lengths = []
        for shard in index["shards"]:
            _check_shard(folder, shard, np.dtype(index["dtype"]), verify)
            try:
                lengths.append(np.load(folder / shard["lengths"]))
            except (OSError, ValueError):
                lengths.append(np.zeros(0, np.uint32))  # refused just below
            if int(lengths[-1].sum()) != shard["tokens"] or len(lengths[-1]) != shard["documents"]:
                raise DataError(f"the token cache shard {folder / shard['lengths']} does not match its index: "
                                f"delete {folder} to build it again")
        return cls(folder, index, lengths)


def _check_shard(folder: Path, shard: dict[str, Any], dtype: np.dtype, verify: bool) -> None:
    path = folder / shard["file"]
    expected = shard["tokens"] * dtype.itemsize
    size = path.stat().st_size if path.is_file() else None
    if size != expected:
        state = "is missing" if size is None else f"is truncated ({size} of {expected} bytes)"
        raise DataError(f"the token cache shard {path} {state}: delete {folder} to build it again")
    if verify and _crc32(path) != shard["crc32"]:
        raise DataError(f"the token cache shard {path} is corrupt (its CRC-32 is not the one written): delete "
                        f"{folder} to build it again (data.verify_shards=false skips this check)")


def _crc32(path: Path) -> int:
    """Read in chunks, not mapped: the page cache does not count as this process's memory."""
    crc = 0
    with path.open("rb") as handle:
        while chunk := handle.read(CRC_CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
    return crc


# -- building -----------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _start_worker(tokenizer: str, separator: int | None, dtype: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker: num_proc workers, num_proc cores
    _WORKER.update(tokenizer=Tokenizer.from_str(tokenizer), separator=separator, dtype=np.dtype(dtype))


def _encode_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    return encode_documents(texts, _WORKER["tokenizer"], _WORKER["separator"], _WORKER["dtype"])


def encode_documents(texts: list[str], tokenizer: Tokenizer, separator: int | None,
                     dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The documents' tokens, each after ``separator`` (if any), concatenated; and their lengths."""
    encodings = tokenizer.encode_batch_fast(texts)
    extra = 0 if separator is None else 1
    lengths = np.fromiter((len(encoding.ids) + extra for encoding in encodings), dtype=np.int64, count=len(texts))
    tokens = np.empty(int(lengths.sum()), dtype=dtype)
    position = 0
    for encoding, length in zip(encodings, lengths.tolist()):
        if extra:
            tokens[position] = separator
        tokens[position + extra:position + length] = encoding.ids
        position += length
    return tokens, lengths


def _encoded(batches: Iterator[list[str]], tokenizer: Tokenizer, separator: int | None, dtype: np.dtype,
             num_proc: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each batch encoded, in order: in this process for one batch or ``num_proc=1``, else by
    ``num_proc`` forked workers with at most two batches each in flight (bounded memory)."""
    head = list(itertools.islice(batches, 2))
    if len(head) < 2 or num_proc == 1:
        for batch in itertools.chain(head, batches):
            yield encode_documents(batch, tokenizer, separator, dtype)
        return
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # said before forking, so tokenizers has nothing to warn of
    try:
        with ProcessPoolExecutor(num_proc, mp_context=multiprocessing.get_context("fork"), initializer=_start_worker,
                                 initargs=(tokenizer.to_str(), separator, dtype.str)) as pool:
            pending: deque = deque()
            for batch in itertools.chain(head, batches):
                pending.append(pool.submit(_encode_in_worker, batch))
                if len(pending) >= 2 * num_proc:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


class _ShardWriter:
    """Appends encoded documents to the open shard (``.NNNNN.bin.tmp``); a shard past
    ``shard_tokens`` is closed: its file renamed into place, then its record written."""

    def __init__(self, folder: Path, key: StoreKey, shard_tokens: int, first: int) -> None:
        self.folder, self.key, self.shard_tokens, self.number = folder, key, shard_tokens, first
        self.records: list[dict[str, Any]] = []
        self._open()

    def _open(self) -> None:
        self.temporary = self.folder / f".{self.number:05d}.bin.tmp"
        self.handle = self.temporary.open("wb")
        self.crc, self.tokens, self.lengths = 0, 0, []

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        data = tokens.tobytes()
        self.handle.write(data)
        self.crc = zlib.crc32(data, self.crc)
        self.tokens += len(tokens)
        self.lengths.append(lengths.astype(np.uint32))
        if self.tokens >= self.shard_tokens:
            self._close()
            self.number += 1
            self._open()

    def _close(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        if not self.tokens:
            self.temporary.unlink()
            return
        name = f"{self.number:05d}"
        lengths = np.concatenate(self.lengths)
        np.save(self.folder / f"{name}.lengths.npy", lengths)
        os.replace(self.temporary, self.folder / f"{name}.bin")
        record = {"file": f"{name}.bin", "lengths": f"{name}.lengths.npy", "tokens": self.tokens,
                  "documents": len(lengths), "crc32": self.crc, "key": asdict(self.key)}
        _write_json(self.folder / f"{name}.json", record)  # last: the shard is complete once it exists
        self.records.append(record)

    def finish(self) -> list[dict[str, Any]]:
        self._close()
        return self.records


def _write_json(path: Path, value: Any) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(value, indent=1) + "\n")
    os.replace(temporary, path)


def _complete_shards(folder: Path, key: StoreKey) -> list[dict[str, Any]]:
    """The shards an unfinished build completed (0, 1, ... with their records and whole files,
    for the same key); everything else in ``folder`` is removed."""
    kept = []
    while (record_file := folder / f"{len(kept):05d}.json").is_file():
        record = json.loads(record_file.read_text())
        shard = folder / record["file"]
        if (record.get("key") != asdict(key) or not shard.is_file()
                or shard.stat().st_size != record["tokens"] * key.dtype.itemsize
                or not (folder / record["lengths"]).is_file()):
            break
        kept.append(record)
    keep = {name for record in kept for name in (record["file"], record["lengths"], f"{record['file'][:-4]}.json")}
    for path in folder.iterdir():
        if path.name not in keep:
            path.unlink()
    return kept


def _skip(batches: Iterator[list[str]], documents: int) -> Iterator[list[str]]:
    """``batches`` without their first ``documents`` documents."""
    for batch in batches:
        if documents >= len(batch):
            documents -= len(batch)
            continue
        yield batch[documents:]
        documents = 0


def build_store(source: DocumentSource, folder: Path, tokenizer: Tokenizer, separator: int | None,
                num_proc: int = 1, shard_tokens: int = 1 << 28, batch_documents: int = 1000) -> TokenStore:
    """Tokenize ``source`` into a store in ``folder`` (going on after the shards an unfinished
    build completed), with a progress bar of tokens/s. The caller holds the cache's lock."""
    key = store_key(source, tokenizer, separator)
    folder.mkdir(parents=True, exist_ok=True)
    done = _complete_shards(folder, key)
    skipped = sum(record["documents"] for record in done)
    if done:
        log.info("%s: going on after %d complete shards (%d documents) of an unfinished build", source.description,
                 len(done), skipped)
    writer = _ShardWriter(folder, key, shard_tokens, len(done))
    batches = _skip(source.documents(batch_documents), skipped)
    with tqdm(desc=f"tokenizing {source.description}", unit="tok", unit_scale=True,
              initial=sum(record["tokens"] for record in done)) as bar:
        for tokens, lengths in _encoded(batches, tokenizer, separator, key.dtype, num_proc):
            writer.add(tokens, lengths)
            bar.update(len(tokens))
    shards = done + writer.finish()
    if not shards:
        raise DataError(f"{source.description}: the corpus has no text (every document is empty): give it "
                        "documents with text")
    index = {"format": FORMAT, "key": asdict(key), "dtype": key.dtype.name, "shards": shards,
             "documents": sum(shard["documents"] for shard in shards),
             "tokens": sum(shard["tokens"] for shard in shards)}
    _write_json(folder / INDEX_FILE, index)
    return TokenStore.open(folder, key, verify=False)


def open_or_build(source: DocumentSource, folder: Path, tokenizer: Tokenizer, separator: int | None,
                  num_proc: int, verify: bool, shard_tokens: int = 1 << 28) -> TokenStore:
    """The store of ``source`` in ``folder``: read if its build finished, else built (resumed)."""
    if (folder / INDEX_FILE).is_file():
        return TokenStore.open(folder, store_key(source, tokenizer, separator), verify)
    return build_store(source, folder, tokenizer, separator, num_proc, shard_tokens)


class PackedBlocks(torch.utils.data.Dataset):
    """Blocks of ``block`` tokens cut from the concatenated tokens of ``documents`` (indices
    into ``store``, in corpus order); the remainder shorter than a block is dropped. Item ``i``
    is ``{"input_ids": LongTensor[block]}``, read from the memory-mapped shards, and with
    ``position_ids`` (documents apart) ``"position_ids": LongTensor[block]`` too: each token's
    position in its document, 0 where one starts. A document that runs on from the block before
    starts again at 0 here (a block is trained apart from the one before it: the model sees the
    document's cut-off end as a document of its own)."""

    def __init__(self, store: TokenStore, documents: np.ndarray, block: int, position_ids: bool = False) -> None:
        self.store, self.block, self.position_ids = store, block, position_ids
        documents = np.sort(np.asarray(documents, dtype=np.int64))
        # Where each document starts in the concatenation (empty documents start where the next does).
        self.document_offset = np.concatenate([[0], np.cumsum(store.lengths[documents])])[:-1]
        # Runs: documents that follow each other in one shard are one contiguous range of tokens.
        shard, start, length = (store.shard_of[documents], store.start_in_shard[documents],
                                store.lengths[documents])
        new_run = np.ones(len(documents), dtype=bool)
        new_run[1:] = (shard[1:] != shard[:-1]) | (start[1:] != start[:-1] + length[:-1])
        self.run_shard, self.run_start = shard[new_run], start[new_run]
        firsts = np.flatnonzero(new_run)
        self.run_length = np.add.reduceat(length, firsts) if len(firsts) else np.zeros(0, np.int64)
        self.run_offset = np.concatenate([[0], np.cumsum(self.run_length)])
        self.tokens = int(self.run_offset[-1])
        self.documents = len(documents)
        self.document_ids = documents  # which of the store's documents (the long-context probe reads them whole)

    def __len__(self) -> int:
        return self.tokens // self.block

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"block {index} of {len(self)}")
        low, high = index * self.block, (index + 1) * self.block
        run = int(np.searchsorted(self.run_offset, low, side="right")) - 1
        pieces = []
        while low < high:
            offset = low - self.run_offset[run]
            take = min(high - low, self.run_length[run] - offset)
            begin = self.run_start[run] + offset
            pieces.append(self.store.shard(int(self.run_shard[run]))[begin:begin + take])
            low += take
            run += 1
        tokens = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        item = {"input_ids": torch.from_numpy(tokens.astype(np.int64))}
        if self.position_ids:
            item["position_ids"] = torch.from_numpy(self.positions_in_documents(index * self.block))
        return item

    def positions_in_documents(self, low: int) -> np.ndarray:
        """The position of each token of the block starting at ``low`` in its own document, the
        block's first token at 0 whatever came before it."""
        where = np.arange(low, low + self.block)
        starts = self.document_offset[np.searchsorted(self.document_offset, where, side="right") - 1]
        return where - np.maximum(starts, low)
