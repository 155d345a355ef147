"""Corpora, tokenizers and the LightningDataModules (language modelling; MQAR)."""

from mcsd.data.corpus import DataError
from mcsd.data.datamodule import LanguageModelDataModule
from mcsd.data.mqar import MQARDataModule

__all__ = ["DataError", "LanguageModelDataModule", "MQARDataModule"]
