"""Callbacks of ours: the saved-model format (tokenizer in every checkpoint, the final model
folder), the stop of a run that diverged, a cap on training epochs that leaves the learning-rate schedule alone, the model
summary with the model's FLOPs, and each part's gradient norm and output RMS (training dynamics). What a checkpoint remembers for resuming: :mod:`mcsd.checkpoint.resume`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import RichModelSummary, ThroughputMonitor
from lightning.pytorch.utilities import grad_norm
from lightning.pytorch.loggers import WandbLogger

from mcsd.bench.peaks import known_gpu
from mcsd.checkpoint import saved_model
from mcsd.checkpoint.sharded import full_state_dict, is_sharded
from mcsd.errors import MCSDError
from mcsd.models.config import ConfigError
from mcsd.precision import Precision, dtype_name


def batch_size(batch: dict[str, torch.Tensor]) -> int:
    """Sequences in a batch (for Lightning's ThroughputMonitor)."""
    return batch["input_ids"].shape[0]


def batch_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens the model reads in a batch (the monitor's items: its items_per_sec is tokens/s):
    all of them with ``labels`` (MQAR), all but the last of each row for next-token prediction."""
    ids = batch["input_ids"]
    return ids.numel() if "labels" in batch else ids.shape[0] * (ids.shape[1] - 1)


def dense_peak_flops(device: torch.device, device_name: str, precision: str) -> float | None:
    """The dense datasheet peak (FLOP/s) of a known GPU (:mod:`mcsd.bench.peaks`, the benchmarks' own)
    at a run's ``trainer.precision``: what MFU divides by; ``None`` on a CPU or a GPU the table lacks."""
    gpu = known_gpu(device_name) if device.type == "cuda" else None
    if gpu is None:
        return None
    return gpu.flops[dtype_name(Precision.of_trainer(precision).compute)]


class Throughput(ThroughputMonitor):
    """Lightning's ``ThroughputMonitor`` with the MFU (``train/device/mfu``) of :func:`dense_peak_flops`
    (the benchmarks' dense datasheet peaks, which know GPUs Lightning's table lacks, such as the H200),
    so that a run's MFU and ``mcsd-bench``'s divide by the same number; none on a CPU."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        device = trainer.strategy.root_device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
        self.available_flops = dense_peak_flops(device, name, str(trainer.precision))
        for throughput in self._throughputs.values():  # Lightning's own, made by its setup with its table's peak
            throughput.available_flops = self.available_flops


class ModelSummary(RichModelSummary):
    """Lightning's rich model summary, whose ``Total FLOPs`` (the FLOPs of one forward pass of
    ``example_input_array``, which the project's module has none of) would read 0: here it is
    the forward FLOPs of one training batch by the model's own count
    (:meth:`mcsd.models.CausalLM.forward_flops`), and the per-module FLOPs column (all zeros) is
    left out."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        data = getattr(trainer.datamodule, "hparams", {})
        model = getattr(pl_module, "model", None)
        self.batch_flops = (model.forward_flops(data["batch_size"], data["seq_len"])
                            if model is not None and "batch_size" in data and "seq_len" in data else 0)
        super().on_fit_start(trainer, pl_module)

    def summarize(self, summary_data: list[tuple[str, list[str]]], total_parameters: int,  # type: ignore[override]
                  trainable_parameters: int, model_size: float, total_training_modes: dict[str, int],
                  total_flops: int, **summarize_kwargs: Any) -> None:
        columns = [column for column in summary_data if column[0] != "FLOPs"]
        RichModelSummary.summarize(columns, total_parameters, trainable_parameters, model_size, total_training_modes,
                                   self.batch_flops or total_flops, **summarize_kwargs)


class SaveFinalModel(L.Callback):
    """The saved-model format (:mod:`mcsd.checkpoint.saved_model`) of a run: the tokenizer goes into
    every checkpoint, so that a step checkpoint loads, scores and generates by itself; when
    training finishes (reaches its last step) the model folder (weights, config, tokenizer)
    is written to ``dirpath``."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = Path(dirpath)

    @staticmethod
    def _tokenizer(trainer: L.Trainer) -> Any:
        return getattr(trainer.datamodule, "tokenizer", None)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        tokenizer = self._tokenizer(trainer)
        if tokenizer is not None:
            checkpoint[saved_model.CHECKPOINT_TOKENIZER_KEY] = tokenizer.to_str()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step < trainer.max_steps:
            return  # stopped early (interrupted): the model folder is for finished runs
        model = pl_module.model
        if is_sharded(model):  # every process takes part in gathering; the first one gets the whole model
            weights = full_state_dict(model)
            model = saved_model.whole_model(model.config, weights) if trainer.is_global_zero else None
        if trainer.is_global_zero:
            seq_len = getattr(trainer.datamodule, "hparams", {}).get("seq_len")
            wandb_run = next((logger.version for logger in trainer.loggers if isinstance(logger, WandbLogger)), None)
            saved_model.save(model, self.dirpath, self._tokenizer(trainer), seq_len, wandb_run)


class DivergedError(MCSDError):
    """Training met a non-finite loss (or weights): ``step`` is the step at which it was seen."""

    def __init__(self, message: str, step: int) -> None:
        super().__init__(message)
        self.step = step


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    local = [tensor.to_local() if hasattr(tensor, "to_local") else tensor for tensor in tensors]  # a DTensor's shard
    return bool(torch.stack([torch.isfinite(tensor).all() for tensor in local]).all()) if local else True


class StopOnDivergence(L.Callback):
    """End a run at the first step whose loss is not finite (no patience: a NaN or infinite loss
    does not come back), and never write a checkpoint whose weights are not finite, so that the
    last checkpoint on disk is one a run can go on from. It raises :class:`DivergedError`, whose
    one line names the step, the loss, the settings that usually cause it and that checkpoint.
    Every process decides together (a NaN on one of them is a NaN on all after the next
    gradient reduction). Lightning runs checkpoint callbacks after this one, so the step that
    met the loss saves nothing."""

    def __init__(self, lr: float | None = None) -> None:
        self.lr = lr

    def _fail(self, trainer: L.Trainer, what: str, step: int) -> None:
        checkpoint = getattr(trainer.checkpoint_callback, "dirpath", None)
        saved = sorted(path for path in Path(checkpoint).glob("step-*") if ".tmp" not in path.name) if checkpoint else []
        kept = (f"the last checkpoint with finite weights is {saved[-1]}" if saved else
                "no checkpoint was saved before it")
        fixes = ["lower optimizer.lr" + (f" (now {self.lr:g})" if self.lr is not None else "")]
        if trainer.gradient_clip_val is None:
            fixes.append("clip gradients (trainer.gradient_clip_val=1.0)")
        if Precision.of_trainer(trainer.precision).compute == torch.float16:
            fixes.append("train in bf16 (fp16 overflows)")
        raise DivergedError(f"{what} at step {step}: training diverged; {', or '.join(fixes)}; {kept}", step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if not isinstance(loss, torch.Tensor):
            return
        finite = trainer.strategy.reduce_boolean_decision(bool(torch.isfinite(loss.detach()).all()), all=True)
        if not finite:
            self._fail(trainer, f"the training loss is {float(loss):g}", trainer.global_step - 1)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        finite = _all_finite([parameter.detach() for parameter in pl_module.parameters()])
        if not trainer.strategy.reduce_boolean_decision(finite, all=True):
            self._fail(trainer, "the weights are not finite", trainer.global_step)


class PlateauStopping(L.pytorch.callbacks.EarlyStopping):
    """Lightning's ``EarlyStopping`` whose decision waits for ``trainer.min_epochs``: a
    stall before then that the metric has since risen out of does not stop the run.
    (The stock callback's stop request stays set through ``min_epochs``, so a run that
    stalled at chance early and then started rising is stopped at ``min_epochs`` anyway.)"""

    def _run_early_stopping_check(self, trainer: L.Trainer) -> None:
        requested_before = trainer.should_stop
        super()._run_early_stopping_check(trainer)
        if not requested_before and trainer.should_stop and trainer.current_epoch + 1 < (trainer.min_epochs or 0):
            trainer.should_stop = False  # counted (wait_count goes on), decided from min_epochs on
            self.stopped_epoch = 0


class EpochCap(L.Callback):
    """Stop training after ``epochs`` epochs (after that epoch's validation) while the
    trainer's ``max_epochs``, over which the learning-rate schedule is laid out, stays
    longer: a compute cap under which every epoch before it is exactly that of the uncapped
    run (experiment=mqar_converge caps its runs this way, keeping the schedule of its anchor)."""

    def __init__(self, epochs: int) -> None:
        if epochs < 1:
            raise ConfigError(f"callbacks.epoch_cap.epochs={epochs}: give at least 1 epoch")
        self.epochs = epochs

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.min_epochs is not None and trainer.min_epochs > self.epochs:
            raise ConfigError(f"callbacks.epoch_cap.epochs={self.epochs} is below trainer.min_epochs={trainer.min_epochs}: "
                              "lower trainer.min_epochs or raise the cap")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch + 1 >= self.epochs:
            trainer.should_stop = True


class TrainingDynamics(L.Callback):
    """Every ``every_n_steps`` training steps (0: off), how each part of the model trains: the L2
    norm of its gradient before the optimizer step (Lightning's ``grad_norm`` per parameter,
    combined per part) and the RMS of its output in that step's forward, logged as
    ``dynamics/grad_norm/<part>`` and ``dynamics/output_rms/<part>``. The parts are the embedding,
    each layer's mixer and MLP, and the LM head: what a layer that learns nothing (RetNet on
    MQAR, issue 90) is compared with a layer that learns by."""

    def __init__(self, every_n_steps: int = 0) -> None:
        if not isinstance(every_n_steps, int) or isinstance(every_n_steps, bool) or every_n_steps < 0:
            raise ConfigError(f"callbacks.training_dynamics.every_n_steps={every_n_steps!r} must be an integer >= 0 "
                              "(0: off)")
        self.every_n_steps = every_n_steps
        self.output_rms: dict[str, float] = {}
        self.hooks: list[torch.utils.hooks.RemovableHandle] = []

    @staticmethod
    def parts(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
        """The model's parts by name (``embed``, ``layers.<i>.mixer``, ``layers.<i>.mlp``, ``lm_head``)."""
        parts = {"embed": model.embed}
        for index, layer in enumerate(model.layers):
            parts[f"layers.{index}.mixer"] = layer.mixer
            if layer.mlp is not None:
                parts[f"layers.{index}.mlp"] = layer.mlp
        parts["lm_head"] = model.lm_head
        return parts

    def logging_step(self, trainer: L.Trainer) -> bool:
        return self.every_n_steps > 0 and trainer.global_step % self.every_n_steps == 0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.every_n_steps:
            return
        for name, part in self.parts(pl_module.model).items():
            def record(module: torch.nn.Module, inputs: Any, output: Any, name: str = name) -> None:
                if module.training and self.logging_step(trainer):
                    value = output[0] if isinstance(output, tuple) else output
                    self.output_rms[name] = float(value.detach().float().pow(2).mean().sqrt())
            self.hooks.append(part.register_forward_hook(record))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        if not self.logging_step(trainer):
            return
        norms = grad_norm(pl_module.model, norm_type=2)  # {"grad_2.0_norm/<parameter>": ..., "..._total": ...}
        squares: dict[str, float] = {}
        parts = list(self.parts(pl_module.model))
        for key, value in norms.items():
            parameter = key.split("/", 1)[1] if "/" in key else None
            part = next((name for name in parts if parameter and
                         (parameter == name or parameter.startswith(name + "."))), None)
            if part is not None:
                squares[part] = squares.get(part, 0.0) + float(value) ** 2
        metrics = {f"dynamics/grad_norm/{part}": total ** 0.5 for part, total in squares.items()}
        metrics |= {f"dynamics/output_rms/{part}": value for part, value in self.output_rms.items()}
        for logger in trainer.loggers:  # at this step alone (values logged through the module would repeat at later steps)
            logger.log_metrics(metrics, step=trainer.global_step)
        self.output_rms = {}
