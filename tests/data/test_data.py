"""The data module: sources, token shards (exact, resumable, checked), held-out and official splits,
tokenizer caching and the resumable data order."""

from __future__ import annotations

import json
import logging
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from helpers.runs import run_here
from mcsd.data import DataError, LanguageModelDataModule
from mcsd.data.corpus import MIN_PARAGRAPHS, PIECE_CHARACTERS, resolve_sample_by
from mcsd.data.datamodule import EpochShuffleSampler, _sample, corpus_sources
from mcsd.data.tokenizer import EOS_TOKEN, train_tokenizer
from mcsd.errors import MCSDError
from mcsd.data.tokens import PackedBlocks, TokenStore, build_store, open_or_build, store_key

WORDS = "the quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun".split()


def make_text(index: int, words: int = 400) -> str:
    """A document of random words (no two blocks of a corpus alike)."""
    return " ".join(random.Random(index).choices(WORDS, k=words)) + "\n"


def module(tmp_path: Path, **options) -> LanguageModelDataModule:
    defaults = dict(source="text_files", vocab_size=300, seq_len=32, batch_size=4, cache_dir=str(tmp_path / "cache"))
    return LanguageModelDataModule(**{**defaults, **options})


def encoded(tokenizer, texts: list[str]) -> list[list[int]]:
    """Each document as training sees it: ``<|endoftext|>`` then its tokens."""
    eos = tokenizer.token_to_id(EOS_TOKEN)
    return [[eos, *tokenizer.encode(text).ids] for text in texts]


def packed(documents: list[list[int]], block: int) -> torch.Tensor:
    """The documents' tokens concatenated and cut into blocks, the remainder dropped."""
    flat = torch.tensor([token for document in documents for token in document])
    return flat[: len(flat) // block * block].reshape(-1, block)


def blocks_of(split) -> torch.Tensor:
    return torch.stack([split[index]["input_ids"] for index in range(len(split))])


def chosen_documents(split) -> list[int]:
    """The store's document numbers a split's blocks are cut from."""
    store = split.store
    return [number for number in range(store.documents) if any(
        start <= store.start_in_shard[number] < start + length and shard == store.shard_of[number]
        for shard, start, length in zip(split.run_shard, split.run_start, split.run_length))]


def test_text_jsonl_and_parquet_files_are_read_as_documents(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text(make_text(0) + "\n" + make_text(1))  # one file, one document
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"body": make_text(i)}) for i in range(2, 5)))
    datasets.Dataset.from_dict({"body": [make_text(5), make_text(6)]}).to_parquet(str(tmp_path / "c.parquet"))
    data = module(tmp_path, paths=[str(tmp_path / name) for name in ("a.txt", "b.jsonl", "c.parquet")],
                  text_field="body")
    splits = data.build()
    texts = [make_text(0) + "\n" + make_text(1)] + [make_text(i) for i in range(2, 7)]
    store = splits["train"].store
    assert store.documents == 6 and store.dtype == np.uint16
    # The shards hold exactly each document's encoding after its separator, in order.
    assert [store.document(number).tolist() for number in range(6)] == encoded(data.tokenizer, texts)
    # Each split's blocks are today's packing of its own documents; no document in two splits.
    numbers = {name: chosen_documents(split) for name, split in splits.items()}
    assert sorted(sum(numbers.values(), [])) == list(range(6)) and len(numbers["val"]) == len(numbers["test"]) == 1
    for name, split in splits.items():
        expected = packed([encoded(data.tokenizer, texts)[number] for number in numbers[name]], 33)
        assert torch.equal(blocks_of(split), expected), name


def test_held_out_documents_are_a_deterministic_function_of_the_seed(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("\n".join(make_text(i, 60).strip() for i in range(40)))

    def held_out(seed: int) -> tuple[list[int], list[int], list[int]]:
        splits = module(tmp_path, paths=[str(tmp_path / "a.txt")], sample_by="line", seed=seed,
                        val_fraction=0.2).build()
        return tuple(chosen_documents(splits[name]) for name in ("train", "val", "test"))

    train, val, test = held_out(0)
    assert held_out(0) == (train, val, test) and held_out(1)[1] != val
    assert not set(train) & set(val) and not set(train) & set(test) and not set(val) & set(test)
    assert len(train) + len(val) + len(test) == 40 and 6 <= len(val) <= 10  # 20% of the tokens
    counted = module(tmp_path, paths=[str(tmp_path / "a.txt")], sample_by="line", val_documents=3,
                     test_documents=2).build()
    assert [counted[name].documents for name in ("train", "val", "test")] == [35, 3, 2]


def test_held_out_files_that_repeat_training_documents_are_caught(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A corpus's own val file: some training documents in it is a warning with their count, only
    training documents a one-line refusal; the comparison is token for token, of every document."""
    texts = {name: [make_text(i) for i in indices] for name, indices in
             (("train", range(6)), ("some", [1, 20, 21, 4]), ("all", [5, 0, 3]))}
    for name, documents in texts.items():
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps({"text": text}) for text in documents))
    with caplog.at_level(logging.WARNING, logger="mcsd.data.datamodule"):
        module(tmp_path, paths={"train": [str(tmp_path / "train.jsonl")], "val": [str(tmp_path / "some.jsonl")]},
               test_fraction=0).build()
    assert "2 of the 4 val documents are training documents too" in caplog.text
    with pytest.raises(DataError, match=r"the val split holds only training documents \(3 of 3\)"):
        module(tmp_path, paths={"train": [str(tmp_path / "train.jsonl")], "val": [str(tmp_path / "all.jsonl")]},
               test_fraction=0).build()


def test_an_unreadable_file_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "locked.txt").write_text(make_text(0))
    monkeypatch.setattr("mcsd.data.corpus.os.access", lambda path, mode: Path(path).name != "locked.txt")
    with pytest.raises(DataError, match=r"data.paths: .*locked.txt is not readable by this user \(permission denied\)"):
        module(tmp_path, paths=[str(tmp_path / "locked.txt")]).build()


def test_a_corpus_with_its_own_splits_uses_them(tmp_path: Path) -> None:
    for name, first in (("train", 0), ("val", 20), ("test", 30)):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps({"text": make_text(i)})
                                                          for i in range(first, first + 4)))
    files = {name: [str(tmp_path / f"{name}.jsonl")] for name in ("train", "val", "test")}
    data = module(tmp_path, paths=files)
    splits = data.build()
    for name, first in (("train", 0), ("val", 20), ("test", 30)):
        documents = encoded(data.tokenizer, [make_text(i) for i in range(first, first + 4)])
        assert torch.equal(blocks_of(splits[name]), packed(documents, 33)), name
    # ... and so does a dataset that load_dataset reads (a Hub dataset, here a local folder).
    hub = tmp_path / "hub" / "data"
    hub.mkdir(parents=True)
    for split, first in (("train", 0), ("validation", 20), ("test", 30)):
        datasets.Dataset.from_dict({"text": [make_text(i) for i in range(first, first + 4)]}).to_parquet(
            str(hub / f"{split}-00000-of-00001.parquet"))
    from_hub = module(tmp_path, source="hub", hub_path=str(hub.parent),
                      splits={"train": "train", "val": "validation", "test": "test"}, tokenizer_path=str(
                          next((tmp_path / "cache").glob("*/tokenizer-300-*.json"))))
    for name, split in from_hub.build().items():
        assert torch.equal(blocks_of(split), blocks_of(splits[name])), name
    with pytest.raises(DataError, match="data.splits.val='dev' is not a split of"):
        module(tmp_path, source="hub", hub_path=str(hub.parent), splits={"train": "train", "val": "dev"}).build()


def test_blocks_cross_shards_and_parallel_tokenization_writes_the_same_tokens(tmp_path: Path) -> None:
    """Shards of ~100 tokens, documents encoded by 2 worker processes in batches of 3: the same
    tokens as one process in one batch; blocks read across shard boundaries as packed."""
    texts = [make_text(i, 40) for i in range(30)]
    source = corpus_sources({"source": "text_files", "paths": [str(write_jsonl(tmp_path / "a.jsonl", texts))]},
                            tmp_path / "hf")["train"]
    tokenizer = train_tokenizer(texts, 300)
    eos = tokenizer.token_to_id(EOS_TOKEN)
    whole = build_store(source, tmp_path / "one", tokenizer, eos, num_proc=1)
    sharded = build_store(source, tmp_path / "two", tokenizer, eos, num_proc=2, shard_tokens=100, batch_documents=3)
    assert len(whole.index["shards"]) == 1 and len(sharded.index["shards"]) >= 5
    documents = [whole.document(number).tolist() for number in range(30)]
    assert documents == encoded(tokenizer, texts)
    assert [sharded.document(number).tolist() for number in range(30)] == documents
    every = np.arange(30)
    assert torch.equal(blocks_of(PackedBlocks(sharded, every, 33)), packed(documents, 33))
    some = np.array([0, 1, 2, 7, 8, 20, 29])
    assert torch.equal(blocks_of(PackedBlocks(sharded, some, 17)), packed([documents[i] for i in some], 17))


def test_blocks_of_documents_apart_say_where_each_document_starts(tmp_path: Path) -> None:
    """data.documents=apart: each block's position_ids count from 0 at every document's first
    token (its separator) and at the block's first token (a document running on from the block
    before starts again there); in a store without separators as well (the store keeps each
    document's length). An empty document never reaches a store: the corpus leaves it out."""
    texts = [make_text(0, 12), " \n", *(make_text(i, 5 + 7 * i) for i in range(1, 6))]
    source = corpus_sources({"source": "text_files", "paths": [str(write_jsonl(tmp_path / "a.jsonl", texts))]},
                            tmp_path / "hf")["train"]
    tokenizer = train_tokenizer(texts, 300)
    eos = tokenizer.token_to_id(EOS_TOKEN)
    store = build_store(source, tmp_path / "store", tokenizer, eos, num_proc=1)
    chosen = np.array([0, 2, 3, 5])
    blocks = PackedBlocks(store, chosen, 17, position_ids=True)
    assert torch.equal(blocks_of(blocks), blocks_of(PackedBlocks(store, chosen, 17)))  # the same tokens
    running_on = torch.cat([torch.arange(store.lengths[number]) for number in chosen])  # across blocks
    for index in range(len(blocks)):
        item = blocks[index]
        assert torch.equal(item["position_ids"] == 0, (item["input_ids"] == eos) | (torch.arange(17) == 0)), index
        expected = running_on[index * 17:(index + 1) * 17].clone()
        before_a_start = torch.cumsum(expected == 0, 0) == 0
        expected[before_a_start] -= expected[0]  # the block's first document, cut: from 0 here
        assert torch.equal(item["position_ids"], expected), index
    assert store.documents == len(texts) - 1  # the whitespace-only one left out
    joined = build_store(source, tmp_path / "joined", tokenizer, None, num_proc=1)
    first, second = (int(length) for length in joined.lengths[[0, 1]])
    positions = PackedBlocks(joined, np.array([0, 1]), first + second, position_ids=True)[0]["position_ids"]
    assert torch.equal(positions, torch.cat([torch.arange(first), torch.arange(second)]))


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("\n".join(json.dumps({"text": text}) for text in texts))
    return path


KILL_AFTER_TWO_SHARDS = """
import os, signal, sys
from pathlib import Path
from mcsd.data import tokens
from mcsd.data.datamodule import corpus_sources
from mcsd.data.tokenizer import train_tokenizer, EOS_TOKEN
from tokenizers import Tokenizer

add = tokens._ShardWriter.add
def add_then_die(self, *args):  # killed while writing the third shard
    add(self, *args)
    if len(self.records) == 2 and self.tokens:
        os.kill(os.getpid(), signal.SIGKILL)
tokens._ShardWriter.add = add_then_die
source = corpus_sources({"source": "text_files", "paths": [sys.argv[1]]}, Path(sys.argv[2]) / "hf")["train"]
tokenizer = Tokenizer.from_file(sys.argv[3])
tokens.build_store(source, Path(sys.argv[2]) / "store", tokenizer, tokenizer.token_to_id(EOS_TOKEN),
                   shard_tokens=200, batch_documents=2)
"""


@pytest.mark.slow
def test_a_killed_build_is_never_read_as_complete_and_goes_on(tmp_path: Path) -> None:
    texts = [make_text(i, 40) for i in range(30)]
    corpus = write_jsonl(tmp_path / "a.jsonl", texts)
    tokenizer = train_tokenizer(texts, 300)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_TWO_SHARDS, str(corpus), str(tmp_path),
                             str(tmp_path / "tokenizer.json")], capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    store = tmp_path / "store"
    assert not (store / "index.json").exists()
    assert sorted(path.name for path in store.glob("0000[0-9].bin")) == ["00000.bin", "00001.bin"]
    assert list(store.glob(".*.tmp"))  # the third shard, unfinished
    stamps = {path.name: path.stat().st_mtime_ns for path in store.glob("0000[01].*")}
    source = corpus_sources({"source": "text_files", "paths": [str(corpus)]}, tmp_path / "hf")["train"]
    eos = tokenizer.token_to_id(EOS_TOKEN)
    with pytest.raises(FileNotFoundError):
        TokenStore.open(store, store_key(source, tokenizer, eos))
    finished = open_or_build(source, store, tokenizer, eos, num_proc=1, verify=True, shard_tokens=200)
    assert {path.name: path.stat().st_mtime_ns for path in store.glob("0000[01].*")} == stamps  # kept, not redone
    assert not list(store.glob(".*.tmp"))
    assert [finished.document(number).tolist() for number in range(30)] == encoded(tokenizer, texts)


def test_damaged_or_foreign_token_caches_are_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("\n".join(make_text(i, 60).strip() for i in range(20)))
    options = dict(paths=[str(tmp_path / "a.txt")], sample_by="line")
    module(tmp_path, **options).build()
    (store,) = (tmp_path / "cache").glob("files-*/tokens-*/train")
    shard = store / "00000.bin"
    original = shard.read_bytes()
    shard.write_bytes(original[:-2])
    with pytest.raises(DataError, match=r"00000.bin is truncated \(\d+ of \d+ bytes\): delete .* to build it again"):
        module(tmp_path, **options).build()
    shard.write_bytes(original[:100] + bytes([original[100] ^ 1]) + original[101:])
    with pytest.raises(DataError, match="00000.bin is corrupt"):
        module(tmp_path, **options).build()
    module(tmp_path, **options, verify_shards=False).build()  # the check can be skipped
    shard.write_bytes(original)
    index = json.loads((store / "index.json").read_text())
    index["key"]["tokenizer"] = "0123456789abcdef"  # a cache built with another tokenizer, moved here
    (store / "index.json").write_text(json.dumps(index))
    with pytest.raises(DataError, match="was built with another tokenizer .'0123456789abcdef'"):
        module(tmp_path, **options).build()
    (store / "index.json").write_text("{")
    with pytest.raises(DataError, match=r"the token cache index .*index.json is unreadable \(JSONDecodeError\)"):
        module(tmp_path, **options).build()


def test_the_tokenizer_is_trained_on_a_bounded_sample(tmp_path: Path) -> None:
    texts = [make_text(i, 50) for i in range(20)]
    source = corpus_sources({"source": "text_files", "paths": [str(write_jsonl(tmp_path / "a.jsonl", texts))]},
                            tmp_path / "hf")["train"]
    assert list(_sample(source, sum(len(text.encode()) for text in texts[:3]) + 1)) == texts[:3]
    assert list(_sample(source, 10)) == texts[:1]  # at least one document


def test_tokenizer_is_trained_once_and_cached(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("".join(make_text(i) for i in range(10)))
    options = dict(paths=[str(tmp_path / "a.txt")], sample_by="line")
    first = module(tmp_path, **options)
    first.build()
    (cached,) = (tmp_path / "cache").glob("files-*/tokenizer-300-100000000.json")
    stamp = cached.stat().st_mtime_ns
    second = module(tmp_path, **options)
    second.build()
    assert cached.stat().st_mtime_ns == stamp
    assert second.tokenizer.encode("the lazy cat").ids == first.tokenizer.encode("the lazy cat").ids
    assert first.tokenizer.get_vocab_size() <= 300
    # ... and a saved tokenizer can be given instead of training one.
    third = module(tmp_path, **options, tokenizer_path=str(cached))
    assert torch.equal(blocks_of(third.build()["train"]), blocks_of(second.splits["train"]))


def test_mcsd_prepare_builds_the_shards_that_training_then_reads(tmp_path: Path) -> None:
    result = run_here("mcsd-prepare", "data=embedded", "model.vocab_size=512", "data.seq_len=128",
                     f"paths.cache_dir={tmp_path / 'cache'}", f"paths.log_dir={tmp_path / 'logs'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    (index,) = (tmp_path / "cache").glob("pydoc-*/tokens-*/train/index.json")
    stamp = index.stat().st_mtime_ns
    data = LanguageModelDataModule(source="embedded", vocab_size=512, seq_len=128, cache_dir=str(tmp_path / "cache"))
    splits = data.build()
    assert index.stat().st_mtime_ns == stamp  # found, not built again
    assert f"token shards: {index.parent.parent}" in result.stdout
    for name in ("train", "val", "test"):
        split = splits[name]
        assert f"{name}: {split.documents:,} documents, {split.tokens:,} tokens, {len(split):,} blocks of 129 tokens" \
            in result.stdout


def test_embedded_corpus_needs_no_network(tmp_path: Path) -> None:
    data = LanguageModelDataModule(source="embedded", vocab_size=512, seq_len=128, cache_dir=str(tmp_path))
    splits = data.build()
    assert len(splits["train"]) > 500 and len(splits["val"]) > 10
    batch = next(iter(data.train_dataloader()))
    assert batch["input_ids"].shape == (16, 129)


def lightning_epochs(loader, epochs: int, first: Iterator | None = None, skip: int = 0) -> list[torch.Tensor]:
    """Batches as Lightning draws them: ``len(loader)`` per epoch from a fresh iterator, never
    draining it (``first``: the iterator of a restored epoch, ``skip`` batches into it)."""
    batches = []
    for epoch in range(epochs):
        iterator = first if epoch == 0 and first is not None else iter(loader)
        batches += [next(iterator)["input_ids"] for _ in range(len(loader) - (skip if epoch == 0 else 0))]
    return batches


def test_train_order_is_a_function_of_seed_and_pass_and_resumes_anywhere(tmp_path: Path) -> None:
    """Every pass is a new order; a loader restored from the state after any batch (mid-epoch,
    on an epoch's last batch, epochs later) continues the same stream."""
    (tmp_path / "a.txt").write_text("".join(make_text(index, 150) for index in range(12)))
    data = module(tmp_path, paths=[str(tmp_path / "a.txt")], sample_by="line", batch_size=5)
    data.build()
    per_epoch = len(data.train_dataloader())
    assert per_epoch >= 4 and len(data.splits["train"]) % 5  # a partial last batch is dropped
    loader = data.train_dataloader()
    stream, states = [], []
    for _ in range(3):
        iterator = iter(loader)
        for _ in range(per_epoch):
            stream.append(next(iterator)["input_ids"])
            states.append(loader.state_dict())
    first, second = (torch.cat(stream[k * per_epoch:(k + 1) * per_epoch]) for k in (0, 1))
    assert first.shape == second.shape and not torch.equal(first, second)
    again = lightning_epochs(data.train_dataloader(), 3)
    assert all(torch.equal(a, b) for a, b in zip(again, stream))  # a function of the seed
    for stop in (2, per_epoch - 1, per_epoch, per_epoch + 1, 2 * per_epoch):
        resumed = data.train_dataloader()
        resumed.load_state_dict(states[stop - 1])
        epoch, done = divmod(stop, per_epoch)
        restored = iter(resumed)
        rest = lightning_epochs(resumed, 3 - epoch, first=restored if done else None, skip=done)
        assert len(rest) == len(stream) - stop
        assert all(torch.equal(a, b) for a, b in zip(rest, stream[stop:])), stop


@pytest.mark.parametrize(("replicas", "drop_last"), [(1, True), (3, True), (3, False)])
def test_each_pass_is_distributed_samplers_order(replicas: int, drop_last: bool) -> None:
    """The sampler holds its pass as a tensor, but the order is torch's DistributedSampler's."""
    blocks = list(range(50))
    for rank in range(replicas):
        ours = EpochShuffleSampler(blocks, num_replicas=replicas, rank=rank, seed=3, drop_last=drop_last, batch_size=1)
        theirs = DistributedSampler(blocks, num_replicas=replicas, rank=rank, seed=3, drop_last=drop_last)
        for epoch in range(2):
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"source": "ftp"}, "data.source='ftp' is unknown"),
        ({"seq_len": 0}, "data.seq_len=0 must be a positive integer"),
        ({"val_fraction": 0.0}, "data.val_fraction=0.0 and data.test_fraction=0.05 must be fractions"),
        ({"token_budget": -1}, "data.token_budget=-1 must be a positive number"),
        ({"paths": []}, "data.paths is empty"),
        ({"paths": ["notes.docx"]}, "notes.docx does not exist"),
        ({"num_proc": 0}, "data.num_proc=0 must be a positive number of processes"),
        ({"val_documents": 0}, "data.val_documents=0 must be a positive number of documents"),
        ({"paths": {"dev": ["a.txt"]}}, "data.paths names splits .'dev'.: use train (required), val and test"),
        ({"sample_by": "word"}, "data.sample_by='word' is unknown: use one of auto, document, paragraph, line, piece"),
        ({"documents": "separate"}, "data.documents='separate' is unknown: use joined"),
    ],
)
def test_bad_data_settings_name_the_field(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        module(tmp_path, **options).build()


def test_too_few_documents_and_empty_splits_are_named(tmp_path: Path) -> None:
    (tmp_path / "one.txt").write_text(make_text(0))
    with pytest.raises(DataError, match=r"the corpus has 1 document\(s\), but validation and test are whole documents "
                                        r"held out of training, so it needs at least 3: .*data.sample_by=paragraph"):
        module(tmp_path, paths=[str(tmp_path / "one.txt")]).build()
    (tmp_path / "blank.txt").write_text(" \n\n")
    with pytest.raises(DataError, match="data=text_files val: the corpus has no text"):
        module(tmp_path, paths={"train": [str(tmp_path / "one.txt")], "val": [str(tmp_path / "blank.txt")]},
               sample_by="document",
               test_fraction=0.0).build()


def test_unsupported_file_type_is_named(tmp_path: Path) -> None:
    (tmp_path / "notes.docx").write_bytes(b"PK")
    with pytest.raises(DataError, match="notes.docx is not .txt, .jsonl, .json or .parquet"):
        module(tmp_path, paths=[str(tmp_path / "notes.docx")]).build()


def test_vocabulary_larger_than_the_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("".join(make_text(i) for i in range(10)))
    trained = module(tmp_path, paths=[str(tmp_path / "a.txt")], sample_by="line")
    trained.build()
    (tokenizer,) = (tmp_path / "cache").glob("files-*/tokenizer-300-*.json")
    with pytest.raises(DataError, match="model.vocab_size=100: raise model.vocab_size"):
        module(tmp_path, paths=[str(tmp_path / "a.txt")], vocab_size=100, tokenizer_path=str(tokenizer)).build()


def test_a_public_corpus_is_fetched_once_checked_and_refused_when_it_cannot_be(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """``python -m mcsd.commands.download NAME to=DIR``: fetched into the folder (here from a file:// copy
    the test makes), checked by its SHA-256, kept; a damaged copy, an address that gives other
    bytes and no internet each end in one line, leaving no partial file."""
    import hashlib

    from mcsd.commands import download

    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 50
    source = tmp_path / "source.txt"
    source.write_text(text)
    corpus = download.PublicCorpus(url=source.as_uri(), sha256=hashlib.sha256(text.encode()).hexdigest(),
                                   file="plays.txt", about="a test corpus")
    monkeypatch.setitem(download.CORPORA, "plays", corpus)
    kept = tmp_path / "data"
    monkeypatch.setattr(sys, "argv", ["download", "plays", f"to={kept}"])
    download.main()
    assert capsys.readouterr().out == f"{kept / 'plays.txt'}\n" and (kept / "plays.txt").read_text() == text
    source.unlink()  # kept: not fetched again
    assert download.fetch("plays", kept) == kept / "plays.txt"
    (kept / "plays.txt").write_text(text + "tampered")
    with pytest.raises(MCSDError, match="plays.txt is not plays \\(its SHA-256 differs\\): remove it and fetch again"):
        download.fetch("plays", kept)
    (kept / "plays.txt").unlink()
    other = tmp_path / "other.txt"
    other.write_text("something else")
    with pytest.raises(MCSDError, match="did not give plays \\(its SHA-256 differs"):
        download.fetch("plays", kept, url=other.as_uri())
    with pytest.raises(SystemExit) as exit_info:  # no internet: a closed local port stands in for the address
        monkeypatch.setattr(sys, "argv", ["download", "plays", f"to={kept}", "url=http://127.0.0.1:9/plays.txt"])
        download.main()
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and error.count("\n") == 1
    assert error.startswith("mcsd.commands.download: error: could not download plays from http://127.0.0.1:9/plays.txt (")
    assert error.endswith(f"without internet here, fetch it where there is and copy it to {kept / 'plays.txt'}\n")
    assert list(kept.iterdir()) == []
    with pytest.raises(MCSDError, match="unknown corpus 'embedded': use one of tinyshakespeare, plays, or give the"):
        download.fetch("embedded", kept)
    assert download.CORPORA["tinyshakespeare"].sha256 == (
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed")  # Karpathy's input.txt, 1,115,394 bytes


def documents_of(paths, sample_by: str = "auto", tmp_path: Path | None = None) -> list[str]:
    sources = corpus_sources({"source": "text_files", "paths": paths, "sample_by": sample_by}, tmp_path / "hf")
    return [text for batch in sources["train"].documents() for text in batch]


def test_a_lone_text_file_is_cut_into_its_paragraphs_or_into_pieces(tmp_path: Path) -> None:
    """``sample_by=auto`` (the default): one ``.txt`` (given as a string, not a list) is its
    paragraphs; one without blank lines is pieces of about PIECE_CHARACTERS characters, each ending
    at a line's end, that put together are the file; several files are a document each."""
    paragraphs = [make_text(index, words=30).strip() for index in range(MIN_PARAGRAPHS + 5)]
    (tmp_path / "paragraphs.txt").write_text("\n\n".join(paragraphs) + "\n")
    assert [text.strip() for text in documents_of(str(tmp_path / "paragraphs.txt"), tmp_path=tmp_path)] == paragraphs
    lines = "".join(make_text(index, words=12) for index in range(400))  # ~30,000 characters, no blank line
    (tmp_path / "lines.txt").write_text(lines)
    pieces = documents_of(str(tmp_path / "lines.txt"), tmp_path=tmp_path)
    assert "".join(pieces) == lines and len(pieces) >= len(lines) // (2 * PIECE_CHARACTERS)
    assert all(piece.endswith("\n") and len(piece) <= 1.5 * PIECE_CHARACTERS for piece in pieces)
    files = [tmp_path / "paragraphs.txt", tmp_path / "lines.txt"]
    assert resolve_sample_by("auto", files) == "document" and resolve_sample_by("line", files[:1]) == "line"
    assert len(documents_of([str(path) for path in files], tmp_path=tmp_path)) == 2


def test_a_home_folder_path_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "mytext.txt").write_text("\n\n".join(make_text(index, words=20) for index in range(30)))
    built = module(tmp_path, paths="~/mytext.txt").build()
    assert sum(split.documents for split in built.values()) == 30
