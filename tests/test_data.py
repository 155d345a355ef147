"""The data module: sources, tokenizer caching, packing and deterministic splits."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import datasets
import pytest
import torch

from mcsd.data import DataError, LanguageModelDataModule
from mcsd.data.tokenizer import EOS_TOKEN

WORDS = "the quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun".split()


def make_text(index: int, words: int = 400) -> str:
    """A document of random words (no two blocks of a corpus alike)."""
    return " ".join(random.Random(index).choices(WORDS, k=words)) + "\n"


def module(tmp_path: Path, **options) -> LanguageModelDataModule:
    defaults = dict(source="text_files", vocab_size=300, seq_len=32, batch_size=4, cache_dir=str(tmp_path / "cache"))
    return LanguageModelDataModule(**{**defaults, **options})


def test_text_jsonl_and_parquet_files_are_read_as_documents(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text(make_text(0) + "\n" + make_text(1))  # one file, one document
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"body": make_text(i)}) for i in range(2, 5)))
    datasets.Dataset.from_dict({"body": [make_text(5), make_text(6)]}).to_parquet(str(tmp_path / "c.parquet"))
    data = module(tmp_path, paths=[str(tmp_path / name) for name in ("a.txt", "b.jsonl", "c.parquet")],
                  text_field="body")
    splits = data.build()
    eos = data.tokenizer.token_to_id(EOS_TOKEN)
    blocks = torch.cat([splits[name][:]["input_ids"] for name in ("train", "val", "test")])
    assert blocks.shape[1] == 33
    assert int((blocks == eos).sum()) == 6  # six documents, each after an <|endoftext|>
    total = sum(len(data.tokenizer.encode(text).ids) + 1 for text in
                [make_text(0) + "\n" + make_text(1)] + [make_text(i) for i in range(2, 7)])
    assert blocks.numel() == total // 33 * 33


def test_splits_are_a_deterministic_function_of_the_seed(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("".join(make_text(i) for i in range(30)))

    def val_blocks(seed: int) -> torch.Tensor:
        return module(tmp_path, paths=[str(tmp_path / "a.txt")], seed=seed, val_fraction=0.2).build()["val"][:]["input_ids"]

    assert torch.equal(val_blocks(0), val_blocks(0))
    assert not torch.equal(val_blocks(0), val_blocks(1))
    splits = module(tmp_path, paths=[str(tmp_path / "a.txt")]).build()
    seen = [tuple(row.tolist()) for name in ("train", "val", "test") for row in splits[name][:]["input_ids"]]
    assert len(seen) == len(set(seen))  # no block in two splits


def test_tokenizer_is_trained_once_and_cached(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("".join(make_text(i) for i in range(10)))
    first = module(tmp_path, paths=[str(tmp_path / "a.txt")])
    first.build()
    (cached,) = (tmp_path / "cache").glob("files-*/tokenizer-300.json")
    stamp = cached.stat().st_mtime_ns
    second = module(tmp_path, paths=[str(tmp_path / "a.txt")])
    second.build()
    assert cached.stat().st_mtime_ns == stamp
    assert second.tokenizer.encode("the lazy cat").ids == first.tokenizer.encode("the lazy cat").ids
    assert first.tokenizer.get_vocab_size() <= 300
    # ... and a saved tokenizer can be given instead of training one.
    third = module(tmp_path, paths=[str(tmp_path / "a.txt")], tokenizer_path=str(cached))
    assert torch.equal(third.build()["train"][:]["input_ids"], second.splits["train"][:]["input_ids"])


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
    data = module(tmp_path, paths=[str(tmp_path / "a.txt")], batch_size=5)
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


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"source": "ftp"}, "data.source='ftp' is unknown"),
        ({"seq_len": 0}, "data.seq_len=0 must be a positive integer"),
        ({"val_fraction": 0.0}, "data.val_fraction=0.0 and data.test_fraction=0.05 must be fractions"),
        ({"token_budget": -1}, "data.token_budget=-1 must be a positive number"),
        ({"paths": []}, "data.paths is empty"),
        ({"paths": ["notes.docx"]}, "notes.docx does not exist"),
    ],
)
def test_bad_data_settings_name_the_field(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        module(tmp_path, **options).build()


def test_unsupported_file_type_is_named(tmp_path: Path) -> None:
    (tmp_path / "notes.docx").write_bytes(b"PK")
    with pytest.raises(DataError, match="notes.docx is not .txt, .jsonl, .json or .parquet"):
        module(tmp_path, paths=[str(tmp_path / "notes.docx")]).build()


def test_vocabulary_larger_than_the_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("".join(make_text(i) for i in range(10)))
    trained = module(tmp_path, paths=[str(tmp_path / "a.txt")])
    trained.build()
    (tokenizer,) = (tmp_path / "cache").glob("files-*/tokenizer-300.json")
    with pytest.raises(DataError, match="model.vocab_size=100: raise model.vocab_size"):
        module(tmp_path, paths=[str(tmp_path / "a.txt")], vocab_size=100, tokenizer_path=str(tokenizer)).build()
