"""Where the text comes from: the embedded corpus, local files, or the Hugging Face Hub.

A data config names up to three splits of documents (``train``, and ``val``/``test`` where the
corpus has its own); each is a :class:`DocumentSource`: a fingerprint that names it in the cache,
and a stream of its documents, opened only when its tokens are built (a cached corpus is never
read or downloaded again).
"""

from __future__ import annotations

import codecs
import hashlib
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import datasets

from mcsd.errors import MCSDError

LOADERS = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
HUB_HINT = "use data=text_files data.paths=[your.txt,...] to train on local files instead"
SPLITS = ("train", "val", "test")
SAMPLE_BY = ("auto", "document", "paragraph", "line", "piece")
MIN_PARAGRAPHS = 20  # sample_by=auto: a lone .txt with fewer paragraphs is cut into pieces instead
PIECE_CHARACTERS = 4000  # sample_by=piece: documents of about this many characters, cut at a line's end


class DataError(MCSDError):
    """The data configuration or the data itself cannot be used."""


def digest(*parts: object) -> str:
    """A short stable hash of ``parts`` (cache names)."""
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class DocumentSource:
    """The documents of one split: ``open()`` gives a ``datasets`` (iterable) dataset with a
    ``text`` column, one document a row, in a fixed order."""

    description: str  # for messages and progress bars: "data=text_files", "data=wikitext103 val"
    fingerprint: str
    open: Callable[[], datasets.Dataset | datasets.IterableDataset]

    def documents(self, batch_size: int = 1000) -> Iterator[list[str]]:
        """The documents in order, in lists of up to ``batch_size``; empty ones (whitespace only) left out."""
        for batch in self.open().iter(batch_size=batch_size):
            texts = [text for text in batch["text"] if text and text.strip()]
            if texts:
                yield texts


def _text_column(dataset: datasets.Dataset | datasets.IterableDataset, text_field: str,
                 source: str) -> datasets.Dataset | datasets.IterableDataset:
    """Keep only ``text_field``, renamed to ``text``."""
    columns = dataset.column_names
    if columns is not None and text_field not in columns:
        raise DataError(f"data.text_field={text_field!r} is not a column of {source} (columns: {columns})")
    dataset = dataset.select_columns([text_field])
    return dataset if text_field == "text" else dataset.rename_column(text_field, "text")


def embedded_corpus() -> dict[str, DocumentSource]:
    """The Python documentation topics that ship inside CPython (``pydoc_data``): about
    0.5 MB of English prose and code, one topic a document; needs no network."""
    from pydoc_data.topics import topics

    texts = [topics[name] for name in sorted(topics)]
    return {"train": DocumentSource("data=embedded", "pydoc-" + digest(*texts),
                                    lambda: datasets.Dataset.from_dict({"text": texts}))}


def _checked_files(paths: list[str], field: str) -> list[Path]:
    """``paths`` resolved, each an existing file of a type we read."""
    if not paths:
        raise DataError(f"{field} is empty: list the files to train on, e.g. {field}=[a.txt,b.txt]")
    files = []
    for raw in paths:
        path = Path(raw).expanduser().resolve()
        if path.is_dir():
            raise DataError(f"{field}: {raw} is a folder: list its files, e.g. {field}=[{raw.rstrip('/')}/a.txt]")
        if not path.is_file():
            raise DataError(f"{field}: {raw} does not exist (looked for {path}): fix the path or drop it")
        if path.suffix.lower() not in LOADERS:
            raise DataError(f"{field}: {raw} is not .txt, .jsonl, .json or .parquet: convert it or drop it")
        if not os.access(path, os.R_OK):
            raise DataError(f"{field}: {raw} is not readable by this user (permission denied): change its permissions "
                            f"(chmod a+r {raw}) or drop it")
        files.append(path)
    return files


def paragraph_breaks(path: Path, chunk_bytes: int = 1 << 24) -> int:
    """How many blank lines (``\\n\\n``) part a text file's paragraphs (a pass over its bytes)."""
    count, tail = 0, b""
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            joined = tail + chunk.replace(b"\r\n", b"\n")
            count += joined.count(b"\n\n")
            tail = joined[-1:]  # a break split across two chunks
    return count


def resolve_sample_by(sample_by: str, files: list[Path]) -> str:
    """``sample_by=auto``: a lone ``.txt`` file is cut into its paragraphs, or, with fewer than
    :data:`MIN_PARAGRAPHS` of them (no blank lines), into pieces of about
    :data:`PIECE_CHARACTERS` characters; several files are a document each."""
    if sample_by != "auto":
        return sample_by
    if len(files) != 1 or LOADERS[files[0].suffix.lower()] != "text":
        return "document"
    return "paragraph" if paragraph_breaks(files[0]) + 1 >= MIN_PARAGRAPHS else "piece"


def plain_paths(paths: Any) -> list[str] | dict[str, list[str]] | None:
    """``data.paths`` as plain types: a file (``data.paths=mytext.txt``) or a list of files as a
    list of strings, a mapping of split names to a file or files as a dict of lists; ``None``
    stays ``None``. (OmegaConf containers are refused by weights-only checkpoint loading.)"""
    if paths is None:
        return None
    if isinstance(paths, str):
        return [paths]
    if isinstance(paths, Mapping):
        return {str(split): plain_paths(files) or [] for split, files in paths.items()}
    return [str(path) for path in paths]


def text_files(paths: str | list[str] | Mapping[str, list[str]], text_field: str, sample_by: str,
               cache_dir: Path) -> dict[str, DocumentSource]:
    """Local ``.txt`` (a file is a document, or its paragraphs, lines or pieces: ``sample_by``;
    ``auto``: :func:`resolve_sample_by`), ``.jsonl``/``.json`` or ``.parquet`` files (a row is a
    document), streamed. ``paths`` is a file, a list (the training documents) or a mapping from
    split names to lists (a corpus's own ``val``/``test`` files)."""
    if sample_by not in SAMPLE_BY:
        raise DataError(f"data.sample_by={sample_by!r} is unknown: use one of {', '.join(SAMPLE_BY)}")
    paths = plain_paths(paths)
    named = dict(paths) if isinstance(paths, Mapping) else {"train": paths or []}
    unknown = sorted(set(named) - set(SPLITS))
    if unknown or "train" not in named:
        raise DataError(f"data.paths names splits {sorted(named)}: use train (required), val and test, e.g. "
                        "data.paths={train:[a.txt],val:[b.txt]}")
    sources = {}
    for split, listed in named.items():
        field = "data.paths" if not isinstance(paths, Mapping) else f"data.paths.{split}"
        files = _checked_files([listed] if isinstance(listed, str) else [str(path) for path in listed or []], field)
        identity = [(str(path), path.stat().st_size, path.stat().st_mtime_ns) for path in files]
        cut = resolve_sample_by(sample_by, files)
        sources[split] = DocumentSource("data=text_files" + ("" if split == "train" else f" {split}"),
                                        "files-" + digest(text_field, cut, *identity),
                                        _file_stream(files, text_field, cut, cache_dir))
    return sources


def _file_stream(files: list[Path], text_field: str, sample_by: str,
                 cache_dir: Path) -> Callable[[], datasets.IterableDataset]:
    """Opens the files as one stream, grouped by type in the order the types first appear."""
    def open_stream() -> datasets.IterableDataset:
        groups: dict[str, list[str]] = {}
        for path in files:
            groups.setdefault(LOADERS[path.suffix.lower()], []).append(str(path))
        parts = []
        for loader, group in groups.items():
            if loader != "parquet":
                _require_utf8(group)
            if loader == "text" and sample_by == "piece":
                parts.append(datasets.IterableDataset.from_generator(_pieces, gen_kwargs={"files": group}))
                continue
            options = {"sample_by": sample_by} if loader == "text" else {}
            part = datasets.load_dataset(loader, data_files=group, split="train", streaming=True,
                                         cache_dir=str(cache_dir), **options)
            parts.append(_text_column(part, "text" if loader == "text" else text_field, group[0]))
        return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    return open_stream


def _pieces(files: list[str]) -> Iterator[dict[str, str]]:
    """``sample_by=piece``: each file's text in documents of about :data:`PIECE_CHARACTERS`
    characters, each ending at a line's end where the piece has one."""
    for file in files:
        with open(file, encoding="utf-8") as handle:
            rest = ""
            while chunk := handle.read(PIECE_CHARACTERS):
                text = rest + chunk
                cut = text.rfind("\n", PIECE_CHARACTERS // 2) + 1 or len(text)
                if len(text) < PIECE_CHARACTERS:
                    cut = len(text)
                rest = text[cut:]
                if text[:cut].strip():
                    yield {"text": text[:cut]}
            if rest.strip():
                yield {"text": rest}


def _conversion(file: str) -> str:
    """The ``iconv`` command that makes ``file`` UTF-8: from UTF-16 or UTF-32 where it starts with
    their byte-order mark, from Latin-1 otherwise (a guess: the commonest other encoding)."""
    with open(file, "rb") as handle:
        start = handle.read(4)
    for mark, encoding in ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
                           (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")):
        if start.startswith(mark):
            return f"it is {encoding.upper()} (it starts with that byte-order mark): convert it, e.g. iconv -f {encoding} -t utf-8"
    return "convert it, e.g. iconv -f latin1 -t utf-8 (if it is Latin-1)"


def _require_utf8(files: list[str], chunk_bytes: int = 1 << 24) -> None:
    """Name the first file (and byte offset) that is not UTF-8 text, before ``datasets`` reads it,
    and how to convert it."""
    for file in files:
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset = 0
        with open(file, "rb") as handle:
            while chunk := handle.read(chunk_bytes):
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as error:
                    raise DataError(f"data.paths: {file} is not UTF-8 text (byte {offset + error.start}: "
                                    f"{chunk[error.start:error.start + 1]!r}): {_conversion(file)}") from None
                offset += len(chunk)
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                raise DataError(f"data.paths: {file} is not UTF-8 text (it ends inside a character, byte "
                                f"{offset - 1}): {_conversion(file)}") from None


def hub_is_reachable(timeout: float = 5.0) -> bool:
    """Whether the Hugging Face Hub's host answers (a fast check before datasets' retries)."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def hub_dataset(name: str, path: str, subset: str | None, splits: Mapping[str, str | None], text_field: str,
                max_documents: int | None, streaming: bool, cache_dir: Path) -> dict[str, DocumentSource]:
    """The splits of a dataset on the Hub (or in a local folder ``load_dataset`` reads):
    ``splits`` maps ``train`` (required), ``val`` and ``test`` to the dataset's own split names
    (null: drawn from the training documents); each split optionally only its first
    ``max_documents`` rows, read by streaming so that nothing more is downloaded."""
    unknown = sorted(set(splits) - set(SPLITS))
    if unknown or not splits.get("train"):
        raise DataError(f"data.splits={dict(splits)} must name the dataset's train split (and optionally val, "
                        "test), e.g. data.splits={train:train,val:validation,test:test}")
    local = Path(str(path)).expanduser().is_dir()
    sources = {}
    for split, dataset_split in splits.items():
        if dataset_split is None:
            continue
        sources[split] = DocumentSource(
            f"data={name}" + ("" if split == "train" else f" {split}"), "hub-" + digest(path, subset, dataset_split, text_field, max_documents),
            _hub_stream(name, str(path), subset, split, str(dataset_split), text_field, max_documents,
                        streaming, cache_dir, local))
    return sources


def _hub_stream(name: str, path: str, subset: str | None, split: str, dataset_split: str, text_field: str,
                max_documents: int | None, streaming: bool, cache_dir: Path,
                local: bool) -> Callable[[], datasets.Dataset | datasets.IterableDataset]:
    def open_stream() -> datasets.Dataset | datasets.IterableDataset:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
        if not local and not offline and not hub_is_reachable():
            raise DataError(f"data={name} needs the Hugging Face Hub, which is unreachable from here: {HUB_HINT}")
        try:
            loaded: Any = datasets.load_dataset(path, subset, split=dataset_split, streaming=streaming,
                                                cache_dir=str(cache_dir))
        except ValueError as error:
            if "split" not in str(error).lower():
                raise
            raise DataError(f"data.splits.{split}={dataset_split!r} is not a split of {path} ({error}): name one "
                            "it has, or null to hold documents out of the training split") from None
        except (ConnectionError, OSError) as error:
            raise DataError(f"data={name}: could not load {path} from the Hub ({type(error).__name__}): "
                            f"{HUB_HINT}") from error
        if max_documents:
            loaded = loaded.take(max_documents) if streaming else loaded.select(range(min(max_documents, len(loaded))))
        return _text_column(loaded, text_field, path)
    return open_stream
