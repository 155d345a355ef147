"""The LightningModule: next-token training of any model from ``mcsd.build_model``."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torchmetrics import MeanMetric

from mcsd.checkpoint.saved_model import load_weights
from mcsd.checkpoint.sharded import is_sharded
from mcsd.data.mqar import IGNORE_INDEX, prediction_accuracy
from mcsd.models import registry
from mcsd.models.build import build_model, make_config
from mcsd.models.config import ConfigError, LMConfig
from mcsd.training.callbacks import batch_tokens
from mcsd.training.checks import COMPRESSION_UNDER_FSDP
from mcsd.training.compression import CompressionDecoder
from mcsd.training.fsdp import FSDP2Strategy, materialize
from mcsd.training.memory import peak_resident_bytes


class LossPerplexity(MeanMetric):
    """Perplexity from the losses themselves: ``exp`` of the mean cross-entropy per scored token
    over every batch seen (each batch's mean loss weighted by its scored tokens, synced over
    processes as any torchmetrics metric). The value torchmetrics' ``Perplexity`` computes from
    the logits, without its softmax over ``[tokens, vocabulary]`` and its boolean-mask index (a
    host sync) at every step."""

    def update(self, loss: torch.Tensor, tokens: int) -> None:  # type: ignore[override]
        super().update(loss.detach().float(), tokens)

    def compute(self) -> torch.Tensor:
        return super().compute().exp()


def freeze_all_but(model: torch.nn.Module, patterns: list[str]) -> None:
    """Train only the parameters whose names match one of the regular expressions ``patterns``
    in full (``trainable``). A pattern may match nothing in one model of a sweep (W_agg at one
    perspective), but some parameter must be left to train."""
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ConfigError(f"trainable={patterns}: {pattern!r} is not a regular expression ({error}): fix it") from None
    names = [name for name, _ in model.named_parameters()]
    for name, param in model.named_parameters():
        param.requires_grad_(any(re.fullmatch(pattern, name) for pattern in patterns))
    if not any(param.requires_grad for param in model.parameters()):
        raise ConfigError(f"trainable={patterns} matches no parameter name (names are like {names[1]!r}): "
                          "fix the patterns")


class LanguageModelModule(L.LightningModule):
    """Wraps a :class:`mcsd.CausalLM`: loss, perplexities, tokens seen, AdamW + schedule.

    A batch of ``input_ids`` alone is next-token prediction (targets are the inputs shifted
    by one). A batch that also has ``labels`` (MQAR, MAD's tasks, retrieval) scores the output at
    each position against ``labels`` at that position, ignoring ``IGNORE_INDEX``, and its
    evaluation also logs the accuracy (per example, then averaged) under the datamodule's
    ``accuracy_metric`` (``mqar_acc``, ``<task>_acc``); a test split past the training length logs
    ``test/loss_at_<N>`` and ``test/<accuracy>_at_<N>``. Every logged curve carries
    ``trainer/tokens`` (tokens consumed by the optimiser so far, over all processes), which the
    loggers use as the x-axis.

    ``compression_length``: MAD's compression task, whose ``labels`` are the sequence itself,
    scored by a :class:`CompressionDecoder` (trained with the model, not part of its saved
    weights) reading the last position's output alone (eager, also with ``compile``).
    """

    def __init__(
        self,
        model: LMConfig | DictConfig | dict[str, Any],
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., torch.optim.lr_scheduler.LRScheduler] | None = None,
        compile: bool = False,
        trainable: list[str] | None = None,
        init_from: str | None = None,
        empty_init: bool = False,
        compression_length: int | None = None,
    ) -> None:
        super().__init__()
        # The config resolved once (a run passes it resolved; a checkpoint's is resolved already),
        # saved as plain types: checkpoints load with weights_only=True.
        config = model if isinstance(model, LMConfig) else make_config(model)
        model = config.to_dict()
        trainable = None if trainable is None else [str(pattern) for pattern in trainable]
        self.save_hyperparameters(logger=False, ignore=["optimizer", "scheduler", "init_from", "empty_init"])
        # Sharded training builds the model on the meta device and initialises each process's
        # shards in configure_model, from the random state a whole model would start from here.
        self.init_rng_state = torch.get_rng_state() if empty_init else None
        with torch.device("meta") if empty_init else contextlib.nullcontext():
            self.model = build_model(config)
        self.decoder = (None if compression_length is None else
                        CompressionDecoder(config.hidden_size, config.vocab_size, compression_length, config.init_std))
        self.init_from = init_from
        if init_from is not None and not empty_init:
            load_weights(self.model, init_from)
        if trainable is not None:
            freeze_all_but(self.model, trainable)
        # by name: sharding replaces the parameters, and with them any attribute they carry
        self.no_weight_decay = {name for name, param in self.model.named_parameters()
                                if getattr(param, "_no_weight_decay", False)}
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.compile = compile
        self.register_buffer("tokens_seen", torch.zeros((), dtype=torch.long))
        self.flops_per_batch = 0  # read by Lightning's ThroughputMonitor (flops_per_sec)
        self.validated_at_step = -1  # the global step of the latest validation
        self.val_ppl, self.test_ppl = LossPerplexity(), LossPerplexity()
        self.val_accuracy, self.test_accuracy = MeanMetric(), MeanMetric()

    def configure_model(self) -> None:
        """Under ``trainer=fsdp``: shard the model, allocate and initialise this process's shards
        (the values one process would draw, :func:`mcsd.training.fsdp.materialize`), then load
        ``init_from``'s weights into them. Lightning calls it for every stage: it acts once."""
        strategy = self.trainer.strategy
        if not isinstance(strategy, FSDP2Strategy) or is_sharded(self.model):
            return
        if self.decoder is not None:  # mcsd-train refuses it before the run (task_problems)
            raise ConfigError(COMPRESSION_UNDER_FSDP)
        strategy.shard(self.model)
        if self.init_rng_state is not None:
            materialize(self.model, self.init_rng_state, strategy.root_device)
        if self.init_from is not None:
            load_weights(self.model, self.init_from)

    def parameter_counts(self) -> dict[str, int]:
        total = sum(p.numel() for p in self.model.parameters())
        embedding = self.model.embed.weight.numel()
        trained = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        activated = self.model.activated_parameters()
        return {"model/params": total, "model/params_non_embedding": total - embedding, "model/params_trained": trained,
                "model/params_activated": activated, "model/params_activated_non_embedding": activated - embedding}

    def describe(self) -> dict[str, Any]:
        """What the run trains, for its logged config: architecture, variant, sizes."""
        architecture = registry.of_config(self.model.config)
        return {"model/arch": architecture.name,
                "model/variant": architecture.variant_of(dataclasses.asdict(self.model.config)),
                "model/mlp_hidden_size": self.model.config.mlp_hidden_size, **self.parameter_counts()}

    def _loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # With compile: the model and its loss in one compiled graph (the model's weights and
        # names are untouched, so checkpoints and saved models are the same).
        ids = batch["input_ids"]
        if self.decoder is not None:  # MAD's compression: every position from the last one's output
            logits = self.decoder(self.model.hidden_states(ids)[:, -1]).flatten(0, 1)
            targets = batch["labels"].flatten()
            return F.cross_entropy(logits.float(), targets), logits[None], targets[None]
        if "labels" in batch:  # the LM head only where a label is (MQAR: K of T positions)
            labels = batch["labels"].flatten()
            positions = (labels != IGNORE_INDEX).nonzero().squeeze(1)
            targets = labels[positions]
            loss, logits = self.model.loss_function(self.compile)(ids, targets, positions=positions)
            return loss, logits[None], targets[None]  # [1, scored, vocab], [1, scored]
        targets = ids[:, 1:]
        if "position_ids" in batch:  # data.documents=apart: each block says where its documents start
            loss, logits = self.model.loss_function(self.compile)(ids[:, :-1], targets,
                                                                  position_ids=batch["position_ids"][:, :-1])
        else:
            loss, logits = self.model.loss_function(self.compile)(ids[:, :-1], targets)
        return loss, logits, targets

    def _training_flops(self, batch: dict[str, torch.Tensor]) -> int:
        """The model FLOPs of this process's step (:meth:`CausalLM.training_flops`): every position
        read, the LM head at the scored ones (MQAR) or at all but the last (next-token)."""
        ids = batch["input_ids"]
        if self.decoder is not None:
            batch_size, length = ids.shape
            return self.model.training_flops(batch_size, length, scored=0) + self.decoder.training_flops(batch_size)
        if "labels" in batch:
            scored = int((batch["labels"] != IGNORE_INDEX).sum())
            return self.model.training_flops(ids.shape[0], ids.shape[1], scored=scored)
        return self.model.training_flops(ids.shape[0], ids.shape[1] - 1)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, logits, targets = self._loss(batch)
        tokens = batch_tokens(batch)
        self.tokens_seen += tokens * self.trainer.world_size
        self.flops_per_batch = self._training_flops(batch)
        self.log("train/loss", loss, prog_bar=True, sync_dist=True)  # the mean over processes: the global batch's
        self.log("train/ppl", loss.detach().exp())  # this process's batch, as the loss it is the exp of
        self.log("trainer/tokens", self.tokens_seen.float())
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Before clipping: the gradient's global norm (``train/grad_norm``: what
        ``trainer.gradient_clip_val`` clips, a sharded run's over every shard) and this process's peak
        memory (``train/peak_memory_bytes``: allocated on a GPU, resident on a CPU)."""
        gradients = [parameter.grad for parameter in self.parameters() if parameter.grad is not None]
        if gradients:
            norm = torch.nn.utils.get_total_norm(gradients)
            self.log("train/grad_norm", norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        gpu = self.device.type == "cuda"
        self.log("train/peak_memory_bytes", float(torch.cuda.max_memory_allocated(self.device) if gpu
                                                  else peak_resident_bytes()))

    def _evaluate(self, batch: dict[str, torch.Tensor], stage: str, metric: LossPerplexity) -> None:
        loss, logits, targets = self._loss(batch)
        datamodule = self.trainer.datamodule
        accuracy_name = getattr(datamodule, "accuracy_metric", "mqar_acc")
        length = batch["input_ids"].shape[1]
        trained_length = getattr(getattr(datamodule, "hparams", None), "seq_len", length)
        if stage == "test" and "labels" in batch and length != trained_length:
            # A test split past the training length (data.test_lengths): its own names, one value per example.
            accuracy = self._accuracy(batch, logits)
            self.log(f"test/loss_at_{length}", loss, on_epoch=True, sync_dist=True, add_dataloader_idx=False)
            self.log(f"test/{accuracy_name}_at_{length}", accuracy.mean(), on_epoch=True, sync_dist=True,
                     batch_size=len(accuracy), add_dataloader_idx=False)
            return
        metric(loss, targets.numel())
        self.log(f"{stage}/loss", loss, on_step=False, on_epoch=True, sync_dist=True, prog_bar=stage == "val",
                 add_dataloader_idx=False)
        self.log(f"{stage}/ppl", metric, on_step=False, on_epoch=True, prog_bar=stage == "val", add_dataloader_idx=False)
        if "labels" in batch:
            accuracy = getattr(self, f"{stage}_accuracy")
            accuracy(self._accuracy(batch, logits))
            self.log(f"{stage}/{accuracy_name}", accuracy, on_step=False, on_epoch=True, prog_bar=stage == "val",
                     add_dataloader_idx=False)
        self.log("trainer/tokens", self.tokens_seen.float(), on_step=False, on_epoch=True, add_dataloader_idx=False)

    @staticmethod
    def _accuracy(batch: dict[str, torch.Tensor], logits: torch.Tensor) -> torch.Tensor:
        """Per example, the fraction of its labelled positions predicted (the scored logits' argmax)."""
        labels = batch["labels"]
        predictions = torch.full_like(labels, IGNORE_INDEX)
        predictions[labels != IGNORE_INDEX] = logits[0].argmax(-1)
        return prediction_accuracy(predictions, labels)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_ppl)

    def on_validation_epoch_end(self) -> None:
        self.validated_at_step = self.trainer.global_step

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._evaluate(batch, "test", self.test_ppl)

    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW with weight decay on matrices only (not on norms, gains, embeddings nor parameters
        marked ``_no_weight_decay``: RWKV-4's mixes), over the parameters being trained (and the
        compression decoder's)."""
        decay, no_decay = [], []
        parameters = list(self.model.named_parameters())
        if self.decoder is not None:
            parameters += [(f"decoder.{name}", param) for name, param in self.decoder.named_parameters()]
        for name, param in parameters:
            if not param.requires_grad:
                continue
            matrix = param.dim() >= 2 and "embed" not in name and name not in self.no_weight_decay
            (decay if matrix else no_decay).append(param)
        optimizer = self.optimizer_factory(params=[{"params": decay}, {"params": no_decay, "weight_decay": 0.0}])
        if self.scheduler_factory is None:
            return {"optimizer": optimizer}
        scheduler = self.scheduler_factory(optimizer=optimizer, total_steps=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
