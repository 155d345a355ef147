"""The CPU time of a training step (forward and backward) of trained models, with denormal floats
computed (torch's default) and flushed to zero (``flush_denormal=true``), side by side: each model's
settings alternate within every repeat. Also each model's share of denormal values (what x86
computes many times slower) in the step: among its modules' outputs, the tensors saved for the
backward, the gradients of the modules' outputs and the weights' gradients.

    python experiments/denormals/measure.py OUT_DIR RUN_DIR [RUN_DIR...] [--repeats 5]

A RUN_DIR is an ``mcsd-train`` run folder of a task (its saved ``model/`` and its logged data
node): the step runs on the first training batch of its own data, as in its training. Each run's
model is also measured freshly initialised (``init: random``, once per model), the control. Writes
``OUT_DIR/results.csv`` (a row per model, init and setting: median, min and max seconds over the
repeats) and prints the ratios.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import statistics
import time
from pathlib import Path

import hydra.utils
import torch

from mcsd.checkpoint.run_folder import RunFolder
from mcsd.training.module import LanguageModelModule

SMALLEST_NORMAL = torch.finfo(torch.float32).tiny


def _denormals(tensor: torch.Tensor) -> tuple[int, int]:
    """How many of ``tensor``'s values are denormal (nonzero, below the smallest normal fp32), of how many."""
    if not tensor.is_floating_point():
        return 0, 0
    magnitude = tensor.detach().abs()
    return int(((magnitude > 0) & (magnitude < SMALLEST_NORMAL)).sum()), tensor.numel()


def denormal_shares(module: LanguageModelModule, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """The share of denormal values in one training step of ``batch``: among the outputs of every
    module, the tensors autograd saves for the backward, the gradients of the modules' outputs
    (what the backward's matrix products read) and the weights' gradients."""
    counts = {"outputs": [0, 0], "saved": [0, 0], "output_gradients": [0, 0], "weight_gradients": [0, 0]}

    def add(kind: str, tensors: object) -> None:
        for tensor in tensors if isinstance(tensors, tuple) else (tensors,):
            if isinstance(tensor, torch.Tensor):
                denormal, total = _denormals(tensor)
                counts[kind][0] += denormal
                counts[kind][1] += total

    def save(tensor: torch.Tensor) -> torch.Tensor:
        add("saved", tensor)
        return tensor

    children = list(module.model.modules())
    hooks = [*(child.register_forward_hook(lambda _module, _inputs, output: add("outputs", output)) for child in children),
             *(child.register_full_backward_hook(lambda _module, _inputs, outputs: add("output_gradients", outputs))
               for child in children if not list(child.children()))]
    module.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(save, lambda tensor: tensor):
        loss = module._loss(batch)[0]
    loss.backward()
    for hook in hooks:
        hook.remove()
    for parameter in module.parameters():
        add("weight_gradients", parameter.grad)
    return {kind: denormal / max(total, 1) for kind, (denormal, total) in counts.items()}


def step_seconds(module: LanguageModelModule, batch: dict[str, torch.Tensor], flush: bool) -> float:
    torch.set_flush_denormal(flush)
    try:
        module.zero_grad(set_to_none=True)
        start = time.perf_counter()
        module._loss(batch)[0].backward()
        return time.perf_counter() - start
    finally:
        torch.set_flush_denormal(False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--repeats", type=int, default=5)
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    rows, controlled = [], set()
    for run in arguments.runs:
        config = RunFolder(run).logged_config()
        datamodule = hydra.utils.instantiate(config["data"])
        datamodule.setup("fit")
        batch = next(iter(datamodule.train_dataloader()))
        optimizer = functools.partial(torch.optim.AdamW, lr=0.0)
        node = json.dumps(config["model"], sort_keys=True)  # one control per model: the rates' start alike
        for init, init_from in (("trained", str(run / "model")), *((("random", None),) if node not in controlled else ())):
            controlled.add(node)
            torch.manual_seed(0)
            module = LanguageModelModule(config["model"], optimizer, init_from=init_from).train()
            shares = denormal_shares(module, batch)
            step_seconds(module, batch, flush=False)  # warm-up
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(arguments.repeats):
                for flush in (False, True):
                    times[flush].append(step_seconds(module, batch, flush))
            for flush, seconds in times.items():
                rows.append({"run": run.name, "arch": config["model/arch"], "lr": config["optimizer"]["lr"],
                             "init": init, "flush_denormal": flush,
                             **{f"denormal_{kind}": f"{share:.2e}" for kind, share in shares.items()},
                             "median_s": f"{statistics.median(seconds):.3f}", "min_s": f"{min(seconds):.3f}",
                             "max_s": f"{max(seconds):.3f}", "repeats": arguments.repeats,
                             "batch": "x".join(map(str, batch["input_ids"].shape))})
            ratio = statistics.median(times[False]) / statistics.median(times[True])
            print(f"{config['model/arch']} lr {config['optimizer']['lr']:g} {init}: denormal shares "
                  + ", ".join(f"{kind} {share:.2e}" for kind, share in shares.items()) + ", "
                  f"step {statistics.median(times[False]):.3f} s, flushed {statistics.median(times[True]):.3f} s: "
                  f"{ratio:.2f}x", flush=True)
    arguments.out_dir.mkdir(parents=True, exist_ok=True)
    with (arguments.out_dir / "results.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
