"""What every benchmark point measures with: its model built or loaded, its time (the device
synchronised), its peak memory and the memory it may take, dynamo's graph count. The points
themselves are :mod:`mcsd.bench.decoding` (inference) and :mod:`mcsd.bench.training_step`
(training); the machine's own limits, :mod:`mcsd.bench.limits`.
"""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._dynamo.utils import counters

from mcsd.checkpoint.saved_model import load
from mcsd.deploy.quantize import stored_bytes
from mcsd.models.build import build_model
from mcsd.models.config import LMConfig
from mcsd.models.modeling import CausalLM


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(function: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """Seconds ``function`` takes (after the device has finished), and its result."""
    synchronize(device)
    start = time.perf_counter()
    result = function()
    synchronize(device)
    return time.perf_counter() - start, result


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated device memory (GPU) or peak resident memory of this process (CPU).

    On Linux the CPU peak is ``VmHWM`` of ``/proc/self/status``, the high-water mark of this
    process's own address space: ``getrusage``'s ``ru_maxrss`` would carry over the peak of the
    parent that started it (Linux keeps it across fork and exec), so a point's process would
    report its launcher's memory.
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def limit_extra_memory(megabytes: float | None) -> None:
    """Cap what this process may allocate beyond what it holds now (simulates a smaller
    machine: a bigger allocation fails as out of memory)."""
    if megabytes is None:
        return
    with open("/proc/self/statm") as handle:
        virtual_bytes = int(handle.read().split()[0]) * resource.getpagesize()
    limit = virtual_bytes + int(megabytes * 2**20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def build(model_cfg: LMConfig | dict[str, Any] | str, device: torch.device, dtype: torch.dtype, seed: int) -> CausalLM:
    """A model config (or node) built with seeded random weights, or a saved model (a path) loaded."""
    if isinstance(model_cfg, str):
        return load(model_cfg, device=device, dtype=dtype)
    torch.manual_seed(seed)  # every device's generator: the model is drawn on its own device
    return build_model(model_cfg, device=device, dtype=dtype)


def compiled_graphs() -> int:
    """How many graphs dynamo has compiled in this process so far."""
    return counters["stats"]["unique_graphs"]


@contextlib.contextmanager
def no_eager_fallback(compile: bool) -> Iterator[None]:
    """With ``compile``, a recompile past dynamo's limit raises (the point is an error) where it
    would silently run the rest eagerly."""
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=compile):
        yield


def weights_bytes(model: torch.nn.Module) -> int:
    """The bytes of every weight as stored (a quantized one's integers and scales)."""
    return sum(stored_bytes(param) for param in model.parameters())
