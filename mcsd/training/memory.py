"""The memory plan of a training run, made before anything is allocated: what each process will
hold (parameters, gradients, optimizer state, activations) for the chosen size, batch, precision,
number of processes, sharding and activation checkpointing, and whether it fits the device.

Parameters, gradients and AdamW's two moments follow from the parameter count (on the meta
device). Activations are measured, not modelled: one forward and loss of the model on the meta
device (shapes without memory) at this process's batch, summing the tensors autograd saves for
the backward (with activation checkpointing: the layers' inputs, plus one layer recomputed), plus
the vocabulary-sized transients of the loss (16-bit compute: halved, an estimate). On a CPU the process's memory before the model
(Python, torch, Lightning) is measured and added; the data, built later, is not counted.
"""

from __future__ import annotations

import dataclasses
import os

import psutil
import torch

from mcsd.errors import MCSDError
from mcsd.models.modeling import CausalLM

GIB = 2**30
ADAM_STATES = 2  # exp_avg, exp_avg_sq, fp32 like the parameters
VOCABULARY_TRANSIENTS = 5


def resident_bytes() -> int:
    """This process's resident memory now (``VmRSS``)."""
    return psutil.Process().memory_info().rss


def _high_water_mark_bytes() -> int:
    """The kernel's ``VmHWM`` of this process (``ru_maxrss`` would carry the launching process's
    peak across fork and exec); ``VmRSS`` where the system has no ``/proc``."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resident_bytes()


_highest_seen = 0


def peak_resident_bytes() -> int:
    """This process's peak resident memory so far: never less than an earlier reading. The kernel's
    ``VmHWM`` is the larger of a recorded mark and the current resident size, which it sums from
    per-thread counters synced lazily, so two readings can fall by a few pages."""
    global _highest_seen
    _highest_seen = max(_highest_seen, _high_water_mark_bytes())
    return _highest_seen


def saved_activation_bytes(model: CausalLM, batch: int, length: int) -> int:
    """Bytes of the tensors a training forward and loss of ``model`` (built on the meta device)
    save for the backward in fp32 (parameters excluded, each storage once): no memory, any size."""
    saved: dict[int, int] = {}
    weights = {parameter.untyped_storage()._cdata for parameter in model.parameters()}
    with torch.device("meta"):
        ids = torch.zeros(batch, length, dtype=torch.long)

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            if storage._cdata not in weights:
                saved[storage._cdata] = storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model.loss(ids, ids)
    return sum(saved.values())


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """One process's share of a run, in bytes; ``available`` is what its device offers it."""

    rank: int
    processes: int
    sharded: bool
    parameters: int
    gradients: int
    optimizer: int
    gathered: int  # FSDP: layers gathered whole for compute; DDP: its gradient buckets
    activations: int
    runtime: int  # what the process holds before the model (CPU: Python, torch, the data)
    available: int
    device: str

    @property
    def total(self) -> int:
        return (self.parameters + self.gradients + self.optimizer + self.gathered + self.activations
                + self.runtime)

    def line(self) -> str:
        gib = lambda value: f"{value / GIB:.2f}"  # noqa: E731
        what = "sharded over" if self.sharded else "on each of"
        extra = "gathered layers" if self.sharded else "gradient buckets"
        return (f"memory plan, process {self.rank} ({what} {self.processes} process"
                f"{'es' if self.processes > 1 else ''}): {gib(self.total)} GiB = parameters {gib(self.parameters)}"
                f" + gradients {gib(self.gradients)} + optimizer {gib(self.optimizer)} + {extra} {gib(self.gathered)}"
                f" + activations {gib(self.activations)} + runtime {gib(self.runtime)}; {self.device} offers "
                f"{gib(self.available)} GiB per process")


def plan_memory(model: CausalLM, batch: int, length: int, processes: int, processes_per_node: int,
                sharded: bool, compute_dtype: torch.dtype, device: str) -> MemoryPlan:
    """The plan of one process of a run training ``model`` (built on the meta device: no memory,
    any size) on ``batch`` x ``length`` tokens per process, over ``processes`` processes
    (``sharded``: FSDP, else whole copies), with fp32 parameters and optimizer state and
    activations in ``compute_dtype``."""
    count = sum(parameter.numel() for parameter in model.parameters())
    largest_layer = max(sum(parameter.numel() for parameter in layer.parameters()) for layer in model.layers)
    root = count - sum(parameter.numel() for parameter in model.layers.parameters())
    share = processes if sharded else 1
    parameters = 4 * count // share
    gradients = 4 * count // share
    optimizer = ADAM_STATES * 4 * count // share
    width = torch.finfo(compute_dtype).bits // 8
    if sharded:  # two layers gathered at a time (one computing, one prefetched) and the root's weights
        gathered = width * (2 * largest_layer + root)
    else:  # DDP copies the gradients into its buckets
        gathered = 4 * count if processes > 1 else 0
    activations = saved_activation_bytes(model, batch, length)
    if model.config.activation_checkpointing:  # the backward recomputes one layer at a time
        for layer in model.layers:
            layer.activation_checkpointing = False
        whole = saved_activation_bytes(model, batch, length)
        for layer in model.layers:
            layer.activation_checkpointing = True
        activations += (whole - activations) // model.config.num_layers
    # Autocast does not reach the meta device: 16-bit compute is taken to halve what is saved
    # (its matmul outputs; the states and carries stay fp32: an estimate).
    activations = activations * width // 4
    # Transients over the vocabulary, fp32, at the loss: the logits' gradient, the cross-entropy's
    # softmax in the backward, the train perplexity's softmax and their copies (5 measured at size=base).
    activations += VOCABULARY_TRANSIENTS * 4 * batch * length * model.config.vocab_size
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        available, runtime = torch.cuda.mem_get_info(index)[1], 0
    else:
        available, runtime = psutil.virtual_memory().available // processes_per_node, resident_bytes()
    return MemoryPlan(rank=process_rank(), processes=processes, sharded=sharded, parameters=parameters,
                      gradients=gradients, optimizer=optimizer, gathered=gathered, activations=activations,
                      runtime=runtime, available=available, device="the GPU" if device.startswith("cuda") else "this machine")


def process_rank() -> int:
    """This process's global rank as the launcher set it (0 before Lightning starts the others)."""
    for variable in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        if os.environ.get(variable, "").isdigit():
            return int(os.environ[variable])
    return 0


def check_fits(plan: MemoryPlan, what: str) -> None:
    """Refuse, in one line with the numbers, a run whose plan exceeds what its device offers."""
    if plan.total > plan.available:
        raise MCSDError(f"{what} cannot fit: {plan.line()}: use more processes (trainer.devices, trainer.num_nodes) "
                        "with trainer=fsdp, model.activation_checkpointing=true, a smaller data.batch_size or a smaller "
                        "size")
