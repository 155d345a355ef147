"""The synthetic instruments beside MQAR as one LightningDataModule: MAD's six tasks
(:mod:`mcsd.data.mad`) and the retrieval tasks (:mod:`mcsd.data.retrieval`), trained and scored
as MQAR is (``labels`` aligned with the inputs; ``<stage>/<task>_acc``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader

from mcsd.data.corpus import DataError
from mcsd.data.datamodule import SplitsDataModule
from mcsd.data.mad import MAD_TASKS
from mcsd.data.mqar import LabelledExamples, check_split_sizes
from mcsd.data.retrieval import RETRIEVAL_TASKS

TASKS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {**MAD_TASKS, **RETRIEVAL_TASKS}
"""Every task :class:`TaskDataModule` draws, by name (``data.task``)."""


class TaskDataModule(SplitsDataModule):
    """``num_train`` training examples and ``num_val`` validation and test examples of
    ``data.task`` at ``seq_len`` (each split from its own seed derived from ``seed``; MAD's tasks
    drawn with ``split="train"`` for training, ``"test"`` for the other two), and a test split at
    each of ``test_lengths`` beyond it (the retrieval tasks' lengths past training). ``settings``:
    the task's own arguments (e.g. ``frac_noise``, ``num_needles``)."""

    tokenizer = None  # ids, as MQAR's

    def __init__(self, task: str = "in_context_recall", vocab_size: int = 16, seq_len: int = 128,
                 settings: Mapping[str, Any] | None = None, num_train: int = 12800, num_val: int = 1000,
                 test_lengths: list[int] | None = None, batch_size: int = 64, seed: int = 0, num_workers: int = 0,
                 token_budget: int | None = None, name: str = "tasks") -> None:
        super().__init__()
        if task not in TASKS:
            raise DataError(f"data.task={task!r} is unknown: use one of {', '.join(TASKS)}")
        # Plain types in the saved hyperparameters: a checkpoint loads with weights_only=True.
        settings = OmegaConf.to_container(settings) if isinstance(settings, DictConfig) else dict(settings or {})
        test_lengths = None if test_lengths is None else [int(length) for length in test_lengths]
        check_split_sizes(num_train, num_val, batch_size, token_budget)
        if any(length < seq_len for length in test_lengths or []):
            raise DataError(f"data.test_lengths={list(test_lengths)} must be at least data.seq_len={seq_len} "
                            "(the lengths past training at which the test split is drawn again)")
        self.save_hyperparameters(logger=False)
        self.splits: dict[str, LabelledExamples] = {}
        self.longer_tests: dict[int, LabelledExamples] = {}

    @property
    def accuracy_metric(self) -> str:
        """The name its accuracy is logged under: ``<stage>/<task>_acc``."""
        return f"{self.hparams.task}_acc"

    @property
    def compression_length(self) -> int | None:
        """MAD's compression: the length its decoder reconstructs from the last position's output
        (:class:`mcsd.training.compression.CompressionDecoder`); ``None`` for every other task."""
        return self.hparams.seq_len if self.hparams.task == "compression" else None

    def _draw(self, count: int, seq_len: int, seed: int, split: str) -> LabelledExamples:
        h = self.hparams
        task = TASKS[h.task]
        split_argument = {"split": split} if h.task in MAD_TASKS else {}
        return LabelledExamples(*task(count, seq_len=seq_len, vocab_size=h.vocab_size, seed=seed,
                                      **split_argument, **(h.settings or {})))

    def build(self) -> dict[str, LabelledExamples]:
        """Draw the splits (idempotent; one line on settings the task cannot take)."""
        if not self.splits:
            h = self.hparams
            lengths = sorted(set(h.test_lengths or []) - {h.seq_len})
            seeds = [int(seed.generate_state(1)[0]) for seed in np.random.SeedSequence(h.seed).spawn(3 + len(lengths))]
            self.splits = {"train": self._draw(h.num_train, h.seq_len, seeds[0], "train"),
                           "val": self._draw(h.num_val, h.seq_len, seeds[1], "test"),
                           "test": self._draw(h.num_val, h.seq_len, seeds[2], "test")}
            self.longer_tests = {length: self._draw(h.num_val, length, seed, "test")
                                 for length, seed in zip(lengths, seeds[3:])}
        return self.splits

    def describe(self) -> dict[str, Any]:
        sizes = super().describe()
        return {**sizes, **{f"data/test_tokens_at_{length}": len(split) * length
                            for length, split in self.longer_tests.items()}}

    def test_dataloader(self) -> DataLoader | list[DataLoader]:
        """The test split at ``seq_len``, then one per longer ``test_lengths`` entry (shortest first)."""
        loaders = [self._eval_loader("test")]
        loaders += [DataLoader(split, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers)
                    for _, split in sorted(self.longer_tests.items())]
        return loaders[0] if len(loaders) == 1 else loaders
