"""Corpora, tokenizers and the LightningDataModules (language modelling; MQAR; MAD's tasks and retrieval)."""

from mcsd.data.corpus import DataError
from mcsd.data.datamodule import LanguageModelDataModule
from mcsd.data.mqar import MQARDataModule
from mcsd.data.tasks import TaskDataModule

__all__ = ["DataError", "LanguageModelDataModule", "MQARDataModule", "TaskDataModule"]
