"""Public corpora that the experiments train on, fetched once into a folder of the user's:

    python -m mcsd.commands.download tinyshakespeare            # -> data/tinyshakespeare.txt
    python -m mcsd.commands.download tinyshakespeare to=DIR

Each is checked against its SHA-256, so that every user trains on the same bytes. Where there is
no internet, the error says so in one line and where to put a copy fetched elsewhere."""

from __future__ import annotations

import hashlib
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from mcsd.commands.app import fail, hydra_app
from mcsd.errors import MCSDError


@dataclass(frozen=True)
class PublicCorpus:
    """A text corpus at ``url`` whose bytes hash to ``sha256``, kept as ``file``."""

    url: str
    sha256: str
    file: str
    about: str


CORPORA = {
    "tinyshakespeare": PublicCorpus(
        url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        file="tinyshakespeare.txt",
        about="Tiny Shakespeare (Karpathy's char-rnn): 1,115,394 bytes, 40,000 lines of plays"),
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(name: str, folder: str | Path = "data", url: str | None = None) -> Path:
    """The path of corpus ``name`` in ``folder``, downloaded there first if it is not (``url``:
    another place to fetch the same bytes from, e.g. a mirror or a ``file://`` copy)."""
    if name not in CORPORA:
        raise MCSDError(f"unknown corpus {name!r}: use one of {', '.join(CORPORA)}, or give the path of a text file")
    corpus = CORPORA[name]
    path = Path(folder) / corpus.file
    if path.is_file():
        if _sha256(path) != corpus.sha256:
            raise MCSDError(f"{path} is not {name} (its SHA-256 differs): remove it and fetch again")
        return path
    source = url or corpus.url
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{corpus.file}.", delete=False) as partial:
        try:
            with urllib.request.urlopen(source, timeout=60) as response:
                partial.write(response.read())
        except (urllib.error.URLError, OSError) as error:
            Path(partial.name).unlink()
            reason = getattr(error, "reason", error)
            raise MCSDError(f"could not download {name} from {source} ({reason}): without internet here, fetch it "
                            f"where there is and copy it to {path}") from None
    if _sha256(Path(partial.name)) != corpus.sha256:
        Path(partial.name).unlink()
        raise MCSDError(f"{source} did not give {name} (its SHA-256 differs from {corpus.sha256}): check the address")
    Path(partial.name).replace(path)
    return path


@hydra_app("mcsd.commands.download", "download")
def _download_main(cfg: DictConfig) -> None:
    print(fetch(cfg.name, cfg.to, cfg.url))


def main() -> None:
    """``python -m mcsd.commands.download NAME [to=DIR] [url=URL]``: prints the corpus's path (a
    Hydra app as every command: the first argument is ``name``)."""
    if len(sys.argv) > 1 and "=" not in sys.argv[1] and not sys.argv[1].startswith("-"):
        sys.argv[1] = f"name={sys.argv[1]}"
    old_style = [argument for argument in sys.argv[1:] if argument in ("--to", "--url")]
    if old_style:
        fail("mcsd.commands.download", f"{old_style[0]}: the download takes settings as key=value, as every command: "
                                       f"{old_style[0][2:]}=...")
    _download_main()


if __name__ == "__main__":
    main()
