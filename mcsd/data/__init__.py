"""Corpora, tokenizers and the LightningDataModule."""

from mcsd.data.corpus import DataError
from mcsd.data.datamodule import LanguageModelDataModule

__all__ = ["DataError", "LanguageModelDataModule"]
