"""Byte-level BPE tokenizers (HF ``tokenizers``): trained on the corpus, or loaded."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mcsd.data.corpus import DataError, hub_is_reachable

EOS_TOKEN = "<|endoftext|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A GPT-2-style byte-level BPE with ``vocab_size`` entries (fewer if the corpus has
    fewer merges to learn) and ``<|endoftext|>`` as id 0, the document separator."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def load_tokenizer(path: str) -> Tokenizer:
    """A ``tokenizer.json`` file, or (with internet) a Hub tokenizer name such as ``gpt2``. A
    path that names a file (a ``.json`` name, or one with a folder in it) is never looked up on the
    Hub: a missing one is said to be missing."""
    file = Path(path).expanduser()
    if file.is_file():
        return Tokenizer.from_file(str(file))
    if file.is_dir():
        raise DataError(f"data.tokenizer_path={path} is a folder: give its tokenizer.json")
    hub_name = str(path).count("/") <= 1 and not str(path).startswith((".", "/", "~"))  # gpt2, org/name
    if file.suffix == ".json" or not hub_name:
        raise DataError(f"data.tokenizer_path={path} does not exist (looked for {file.absolute()}): give a "
                        "tokenizer.json file, a Hub tokenizer name such as gpt2, or null to train a BPE on the corpus")
    if not hub_is_reachable():
        raise DataError(f"data.tokenizer_path={path} is not a local file, and as a Hub tokenizer it needs the Hugging "
                        "Face Hub, which is unreachable from here: give a tokenizer.json file, or null to train a "
                        "BPE on the corpus")
    try:
        return Tokenizer.from_pretrained(path)
    except Exception as error:  # the tokenizers library raises plain Exceptions
        raise DataError(f"data.tokenizer_path={path!r} is neither a tokenizer.json file nor a reachable Hub tokenizer") from error


def eos_id(tokenizer: Tokenizer) -> int:
    token_id = tokenizer.token_to_id(EOS_TOKEN)
    if token_id is None:
        raise DataError(f"the tokenizer has no {EOS_TOKEN} token: use a tokenizer that separates documents with it")
    return token_id
