"""Fully sharded training (FSDP2) for ``trainer=fsdp``, on Lightning's ``ModelParallelStrategy``.

The model is built on the meta device (no memory), every :class:`~mcsd.models.modeling.Layer` is
sharded with ``torch.distributed.fsdp.fully_shard`` and then the root (embedding, final norm,
LM head), as torchtitan does; each process then allocates only its shards and fills them with
exactly the values a single process would draw from the same random state
(:func:`materialize`): a run gives the same model on any number of processes, and a 10B model
never exists whole in one process. Checkpoints are ``torch.distributed.checkpoint`` (DCP)
folders, one file per process, written to a hidden folder beside them and renamed into place
(a killed write leaves the previous checkpoint whole); DCP reshards on load, so a checkpoint
resumes on any number of processes. The same config runs on CPUs (gloo) and GPUs (nccl).
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from mcsd.checkpoint.sharded import copy_into
from mcsd.errors import MCSDError
from mcsd.precision import SHORT_NAMES, mixed_precision_dtype
from mcsd.models import CausalLM

# FSDP2 warns that a layer returns views (its decoding state: slices of the last chunk's), which
# an in-place op would cut from the backward; training never touches them.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(\w+\) returned a view tensor")



@torch.no_grad()
def materialize(model: CausalLM, rng_state: torch.Tensor, device: torch.device) -> None:
    """Allocate a (sharded) model built on the meta device on ``device`` and initialise it
    exactly as ``mcsd.build_model`` does on a CPU whose random state is ``rng_state``, one part at a
    time: each initialisation step (:meth:`CausalLM.init_steps`, in their order) runs on a CPU
    copy of its submodule alone, and the parameters it wrote are copied into this process's
    shards. At most one top-level part is whole in memory at a time. The global random state is
    left as it was."""
    model.to_empty(device=device)
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        torch.set_rng_state(rng_state)
        with torch.device("meta"):
            template = type(model)(model.config)
        for step in template.init_steps():
            part = copy.deepcopy(template.get_submodule(step.path)).to_empty(device="cpu")
            written = {id(parameter) for parameter in step.initialise(part)}
            target = dict(model.get_submodule(step.path).named_parameters())
            for name, parameter in part.named_parameters():
                if id(parameter) in written:
                    copy_into(target[name], parameter)


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` as fully sharded data parallel over every process
    (one data-parallel mesh dimension), with:

    - ``mixed_precision``: ``auto`` (bf16 parameters for compute with fp32 gradient reduction
      on GPUs, fp32 on CPUs), ``bf16`` or ``fp32``; the sharded parameters and the optimizer
      state stay fp32;
    - ``reshard_after_forward``: free each layer's gathered parameters after its forward (and
      gather them again for the backward), FSDP2's default: less memory, more communication;
    - checkpoints written atomically (a hidden staging folder renamed into place).
    """

    def __init__(self, mixed_precision: str = "auto", reshard_after_forward: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if mixed_precision not in ("auto", *SHORT_NAMES):
            raise MCSDError(f"trainer.strategy.mixed_precision={mixed_precision!r} is not an option: use auto, "
                            f"{', '.join(SHORT_NAMES)}")
        self.mixed_precision = mixed_precision
        self.reshard_after_forward = reshard_after_forward

    def setup_environment(self) -> None:
        check_processes(self.num_processes, self.num_nodes, self.parallel_devices[0].type)
        self._data_parallel_size, self._tensor_parallel_size = self.num_nodes * self.num_processes, 1
        super().setup_environment()

    @property
    def param_dtype(self) -> torch.dtype:
        """The dtype layers compute in: the policy's, ``auto`` meaning bf16 on a GPU that supports it,
        fp32 elsewhere (:func:`mcsd.precision.mixed_precision_dtype`)."""
        return mixed_precision_dtype(self.mixed_precision, self.root_device)

    def _autocast(self) -> contextlib.AbstractContextManager:
        """16-bit compute also runs under autocast: the models keep their states and carries in fp32
        (as under ``bf16-mixed``), which a bf16 weight alone would not accept as an input."""
        if self.param_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.root_device.type, dtype=self.param_dtype)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._autocast():
            return super().training_step(*args, **kwargs)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._autocast():
            return super().validation_step(*args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._autocast():
            return super().test_step(*args, **kwargs)

    def shard(self, model: CausalLM) -> None:
        """``fully_shard`` every layer, then the root module (embedding, final norm, LM head)."""
        mesh = self.device_mesh["data_parallel"]
        policy = MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=torch.float32)
        for index, layer in enumerate(model.layers):
            # the last layer's parameters are needed again at once by the backward: keep them gathered
            reshard = self.reshard_after_forward and index < len(model.layers) - 1
            fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=self.reshard_after_forward)

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """Every process writes its shard into ``.<name>.tmp/`` beside ``filepath``; once all have,
        the first process renames it into place (a checkpoint already there is moved aside first
        and removed after), so an interrupted write never leaves a partial checkpoint under the name."""
        path = Path(self.broadcast(str(filepath)))
        staging = path.with_name(f".{path.name}.tmp")
        if self.global_rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
        self.barrier()
        super().save_checkpoint(checkpoint, staging, storage_options)
        self.barrier()
        if self.global_rank == 0:
            replace_checkpoint(staging, path)
        self.barrier()


    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """A sharded checkpoint (on any number of processes: DCP reshards), or a checkpoint file of a
        single-process or DDP run, whose optimizer state is keyed by position in the parameter
        groups: matched to the parameters through this run's own groups (which training builds
        in the same order), not through ``named_parameters`` as Lightning's loader assumes."""
        path = Path(self.broadcast(str(checkpoint_path)))
        if path.is_dir():
            return super().load_checkpoint(path, weights_only=weights_only)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        checkpoint = torch.load(path, mmap=True, map_location="cpu", weights_only=weights_only)
        whole = StateDictOptions(full_state_dict=True, strict=self.lightning_module.strict_loading)
        set_model_state_dict(self.model, checkpoint.pop("state_dict"), options=whole)
        names = {id(parameter): name for name, parameter in self.model.named_parameters()}
        for optimizer, state in zip(self.optimizers, checkpoint.pop("optimizer_states", [])):
            order = [names[id(parameter)] for group in optimizer.param_groups for parameter in group["params"]]
            groups, start = [], 0
            for group in state["param_groups"]:
                groups.append({**group, "params": order[start:start + len(group["params"])]})
                start += len(group["params"])
            keyed = {"state": {order[index]: value for index, value in state["state"].items()}, "param_groups": groups}
            set_optimizer_state_dict(self.model, optimizer, keyed, options=whole)
        return checkpoint


def check_processes(devices: int, nodes: int, device_type: str) -> None:
    """``trainer=fsdp`` shards over 2 processes or more; on a GPU one process is allowed too (bf16
    compute with fp32 master weights and DCP checkpoints, the path a larger machine shards)."""
    if devices * nodes < 2 and device_type != "cuda":
        raise MCSDError(f"trainer=fsdp shards the model over processes, but trainer.devices={devices} x "
                        f"trainer.num_nodes={nodes} makes one: use trainer.devices=2 or more (or "
                        "trainer=cpu / trainer=gpu for one device)")


def replace_checkpoint(source: Path, target: Path) -> None:
    """Rename ``source`` to ``target``; a file or folder already at ``target`` is moved aside
    (``.<name>.old``) and removed once ``source`` is in place."""
    old = target.with_name(f".{target.name}.old")
    if old.is_dir():
        shutil.rmtree(old)
    if target.exists():
        target.rename(old)
    source.rename(target)
    if old.is_dir():
        shutil.rmtree(old)
    else:
        old.unlink(missing_ok=True)
