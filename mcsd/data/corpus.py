"""Where the text comes from: the embedded corpus, local files, or the Hugging Face Hub.

Each source loads a ``datasets.Dataset`` with one ``text`` column (one document a row)
and has a fingerprint that names it in the cache.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

import datasets

from mcsd.errors import MCSDError

LOADERS = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
HUB_HINT = "use data=text_files data.paths=[your.txt,...] to train on local files instead"


class DataError(MCSDError):
    """The data configuration or the data itself cannot be used."""


def _digest(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:16]


def _text_column(dataset: datasets.Dataset, text_field: str, source: str) -> datasets.Dataset:
    """Keep only ``text_field``, renamed to ``text``."""
    if text_field not in dataset.column_names:
        raise DataError(f"data.text_field={text_field!r} is not a column of {source} (columns: {dataset.column_names})")
    dataset = dataset.select_columns([text_field])
    return dataset if text_field == "text" else dataset.rename_column(text_field, "text")


def embedded_corpus() -> tuple[datasets.Dataset, str]:
    """The Python documentation topics that ship inside CPython (``pydoc_data``): about
    0.5 MB of English prose and code, one topic a document; needs no network."""
    from pydoc_data.topics import topics

    texts = [topics[name] for name in sorted(topics)]
    return datasets.Dataset.from_dict({"text": texts}), "pydoc-" + _digest(*texts)


def text_files(paths: list[str], text_field: str, cache_dir: Path) -> tuple[datasets.Dataset, str]:
    """Local ``.txt`` (one file = one document), ``.jsonl``/``.json`` or ``.parquet`` files."""
    if not paths:
        raise DataError("data.paths is empty: list the files to train on, e.g. data.paths=[a.txt,b.txt]")
    groups: dict[str, list[str]] = {}
    identity = []
    for raw in paths:
        path = Path(raw).expanduser().resolve()
        if not path.is_file():
            raise DataError(f"data.paths: {raw} does not exist (looked for {path}): fix the path or drop it")
        loader = LOADERS.get(path.suffix.lower())
        if loader is None:
            raise DataError(f"data.paths: {raw} is not .txt, .jsonl, .json or .parquet: convert it or drop it")
        groups.setdefault(loader, []).append(str(path))
        stat = path.stat()
        identity.append((str(path), stat.st_size, stat.st_mtime_ns))
    parts = []
    for loader, files in groups.items():
        options = {"sample_by": "document"} if loader == "text" else {}
        if loader != "parquet":
            _require_utf8(files)
        part = datasets.load_dataset(loader, data_files=files, split="train", cache_dir=str(cache_dir), **options)
        parts.append(_text_column(part, "text" if loader == "text" else text_field, files[0]))
    return datasets.concatenate_datasets(parts), "files-" + _digest(text_field, *sorted(identity))


def _require_utf8(files: list[str], chunk_bytes: int = 1 << 24) -> None:
    """Name the first file (and byte offset) that is not UTF-8 text, before ``datasets`` reads it."""
    for file in files:
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset = 0
        with open(file, "rb") as handle:
            while chunk := handle.read(chunk_bytes):
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as error:
                    raise DataError(f"data.paths: {file} is not UTF-8 text (byte {offset + error.start}: "
                                    f"{chunk[error.start:error.start + 1]!r}): convert it, e.g. "
                                    "iconv -f latin1 -t utf-8") from None
                offset += len(chunk)
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                raise DataError(f"data.paths: {file} is not UTF-8 text (it ends inside a character, byte "
                                f"{offset - 1}): convert it, e.g. iconv -f latin1 -t utf-8") from None


def hub_is_reachable(timeout: float = 5.0) -> bool:
    """Whether the Hugging Face Hub's host answers (a fast check before datasets' retries)."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def hub_dataset(
    name: str, path: str, subset: str | None, split: str, text_field: str, max_documents: int | None,
    streaming: bool, cache_dir: Path,
) -> tuple[datasets.Dataset, str]:
    """A dataset from the Hub (``load_dataset(path, subset, split=...)``), optionally only its
    first ``max_documents`` rows, read by streaming so that nothing more is downloaded."""
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
    if not offline and not hub_is_reachable():
        raise DataError(f"data={name} needs the Hugging Face Hub, which is unreachable from here: {HUB_HINT}")
    try:
        loaded = datasets.load_dataset(path, subset, split=split, streaming=streaming, cache_dir=str(cache_dir))
        if streaming:
            rows = loaded.take(max_documents) if max_documents else loaded
            loaded = datasets.Dataset.from_list([{text_field: row[text_field]} for row in rows])
        elif max_documents:
            loaded = loaded.select(range(min(max_documents, len(loaded))))
    except (ConnectionError, OSError) as error:
        raise DataError(f"data={name}: could not load {path} from the Hub ({type(error).__name__}): {HUB_HINT}") from error
    return _text_column(loaded, text_field, path), "hub-" + _digest(path, subset, split, text_field, max_documents)
