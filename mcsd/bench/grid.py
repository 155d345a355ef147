"""The bench's grid (what ``mcsd-bench`` runs): its points from the config, each measured in a child
process or in this one (:mod:`mcsd.bench.measure`), on a machine checked for other work
(:mod:`mcsd.bench.load`), its rows written after every point.

Every point runs after a warm-up; on a CPU each point runs in a fresh child process so
that peak resident memory belongs to that point alone. A point that fails is a row of its own
(``status`` oom or error, with its one-line ``reason``) and the grid goes on. Results:
results.csv and results.json (with a header naming the machine), written after every point, in
the run directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import itertools
import json
import logging
import os
import platform
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

import torch
from hydra import compose
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from mcsd.bench import measure
from mcsd.bench.load import SPREAD_LIMIT, other_cores, read_clock, sample_other_cores
from mcsd.bench.peaks import mfu_peak
from mcsd.checkpoint.run_folder import model_node_of
from mcsd.checkpoint.saved_model import locate, read_config
from mcsd.data.tokens import DOCUMENTS
from mcsd.deploy.onnx import check_onnx_installed
from mcsd.deploy.quantize import WEIGHT_FORMATS, check_weight_format
from mcsd.files import replace_earlier_results
from mcsd.runtime import StopAfterCurrent, apply_threads, git_commit, interrupted, require_wandb_login
from mcsd.errors import MCSDError
from mcsd.models import registry
from mcsd.models.build import make_config
from mcsd.ops.kernels import KERNELS, kernels_problem

log = logging.getLogger("mcsd.bench")
MODES = ("inference", "train")
RUNTIMES = ("torch", "onnx")
COLUMNS = {
    "inference": ["model", "arch", "variant", "kernels", "weights", "runtime", "size", "params", "batch", "prompt_len", "gen_len", "prefill_s", "decode_s_per_token",
                  "latency_s", "tokens_per_s", "peak_mem_bytes", "weights_bytes", "peak_mem_minus_weights_bytes",
                  "state_bytes_per_sequence", "step_weight_bytes", "step_state_bytes_per_sequence", "step_read_bytes",
                  "read_bandwidth_bytes_per_s", "limit_ratio", "decode_s_per_token_min", "decode_s_per_token_max", "unsteady",
                  "threads", "other_cores", "shared", "compiled", "graphs_recorded_timed", "point_s", "measured_at", "status",
                  "reason"],
    "train": ["model", "arch", "variant", "kernels", "form", "documents", "size", "params", "batch", "seq_len", "activation_checkpointing", "model_flops", "counted_flops", "step_s",
              "first_step_s", "tokens_per_s", "matmul_peak_flops", "peak_flops", "peak_source", "mfu", "peak_mem_bytes", "weights_bytes", "peak_mem_minus_weights_bytes",
              "step_s_min", "step_s_max", "unsteady", "threads", "other_cores", "shared", "compiled", "point_s", "measured_at",
              "status", "reason"],
}
# How an allocation failure reads, on a CPU and on a GPU (the caching allocator's OutOfMemoryError,
# or a library that allocates for itself: cuBLAS, cuDNN, cuFFT, or CUDA's own error).
OUT_OF_MEMORY = ("out of memory", "can't allocate memory", "cannot allocate memory", "alloc_failed",
                 "failed to allocate", "std::bad_alloc")


def models_of(cfg: DictConfig) -> list[str]:
    """The ``models`` entries to bench: as listed, or (null) every registered architecture."""
    return list(cfg.models) if cfg.models is not None else registry.architectures()


def is_run_config(entry: str) -> bool:
    """Whether a ``models`` entry is a YAML file: a run's logged config (``hparams.yaml``) or a
    ``model`` node of its own."""
    return Path(entry).suffix in (".yaml", ".yml")


def model_source(entry: str, size: str, variant: str | None = None) -> tuple[str, str, dict[str, Any] | str]:
    """An entry of ``models``: a registered architecture -> (its name, its variant, the ``model``
    node that ``mcsd-train model=NAME size=SIZE [variant=VARIANT]`` builds, with ``variant`` where
    the architecture has it); a run's config YAML ->
    (its architecture, its variant, its ``model`` node: the trained run's model with seeded
    random weights, which cost what its trained weights cost); a saved model -> (its
    architecture, its variant, its path)."""
    if entry in registry.architectures():
        has_variant = variant is not None and variant in registry.get(entry).variants
        overrides = [f"model={entry}", f"size={size}"] + ([f"variant={variant}"] if has_variant else [])
        node = OmegaConf.to_container(compose("build", overrides=overrides).model, resolve=True)
        return entry, registry.get(entry).variant_of(node), node
    if is_run_config(entry):
        node = model_node_of(entry)
        if node is None:
            raise MCSDError(f"models: {entry} holds no model node (a `model:` with its `_target_`): give a run's "
                            "csv/version_0/hparams.yaml or .hydra/config.yaml")
        architecture = registry.of_config(make_config(node))
        return architecture.name, architecture.variant_of(node), node
    saved = locate(entry)
    config = read_config(saved)
    architecture = registry.of_config(config)
    return architecture.name, architecture.variant_of(dataclasses.asdict(config)), str(saved.path)


def train_forms(cfg: DictConfig, arch: str) -> list[str]:
    """The forms measured in training: ``train.forms`` (where ``training`` stands for the
    architecture's training form), or its parallel (reference) form and its training form."""
    architecture = registry.get(arch)
    forms = list(cfg.train.forms) if cfg.train.forms else ["parallel", "training"]
    forms = list(dict.fromkeys(architecture.train_form if form == "training" else form for form in forms))
    missing = [form for form in forms if form not in architecture.forms]
    if missing:
        raise MCSDError(f"train.forms: {arch} has no form {missing[0]!r}: use some of {', '.join(architecture.forms)}")
    return forms


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation failure (``oom``), on a CPU or a GPU."""
    return (isinstance(error, (MemoryError, torch.OutOfMemoryError))
            or any(text in str(error).lower() for text in OUT_OF_MEMORY))


def measure_point(kind: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One point's measurement (:mod:`mcsd.bench.measure`) with its ``status``: ``ok``; ``oom`` (an
    allocation failure); or ``error``, with its one-line ``reason``, so that the grid goes on. The
    point's memory is freed before it returns: outside the ``except``, whose traceback holds the
    point's tensors (its frames' locals), then the garbage collector and the GPU's cache."""
    try:
        result = {**getattr(measure, f"{kind}_point")(**arguments), "status": "ok"}
    except Exception as error:  # noqa: BLE001  a point's failure is a result: the grid goes on
        lines = str(error).strip().splitlines()
        reason = f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
        result = {"status": "oom" if is_out_of_memory(error) else "error", "reason": reason}
    if arguments.get("compile"):
        torch._dynamo.reset()  # the point's compiled graphs go with its model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def point_processes() -> BaseContext:
    """Where isolated points start: processes forked from a fork server that has imported this
    module (torch, the models) once, so that a point starts at once instead of paying an
    interpreter's start and its imports (seconds each); every point still gets a process of its
    own, forked from one that has never measured anything (its peak memory is its own)."""
    context = get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def _in_child(kind: str, arguments: dict[str, Any], memory_limit_mb: float | None,
              threads: int | None) -> dict[str, Any]:
    """Run one point in this (fresh) process, which leaves Ctrl-C to mcsd-bench."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if threads:
        torch.set_num_threads(threads)
    measure.limit_extra_memory(memory_limit_mb)
    return measure_point(kind, arguments)


def run_point(kind: str, arguments: dict[str, Any], isolate: bool, memory_limit_mb: float | None,
              threads: int | None = None) -> dict[str, Any]:
    """One point, in a fresh process when ``isolate`` (a process killed for memory is OOM too),
    on ``threads`` torch threads (``None``: torch's default; set in this process when not isolated)."""
    if not isolate:
        if threads:
            torch.set_num_threads(threads)
        return measure_point(kind, arguments)
    pool = ProcessPoolExecutor(max_workers=1, mp_context=point_processes())
    # The point's process ignores Ctrl-C (a terminal sends it to the whole process group): it is
    # started with SIGINT ignored (the fork server, started here the first time, keeps ignoring it
    # for the processes it forks). A second Ctrl-C in mcsd-bench kills it.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        started = pool.submit(os.getpid)
    finally:
        signal.signal(signal.SIGINT, previous)
    with pool:
        try:
            return pool.submit(_in_child, kind, arguments, memory_limit_mb, threads).result()
        except BrokenProcessPool:
            return {"status": "oom", "reason": "the point's process was killed (out of memory)"}
        except KeyboardInterrupt:
            if started.done():
                os.kill(started.result(), signal.SIGKILL)
            raise


def _size_label(cfg: DictConfig, name: str, arch: str) -> str:
    """A row's ``size``: the model_size of a registered architecture, else ``config`` (a run's
    config, random weights) or ``saved`` (a saved model)."""
    return cfg.model_size if name == arch else "config" if is_run_config(name) else "saved"


def kernels_of(cfg: DictConfig, arch: str) -> list[str]:
    """The ``kernels`` an entry of architecture ``arch`` is measured with: each of the list where
    its mixers run ops that fla serves (:attr:`Architecture.ops`), else the first alone (the
    Transformer computes the same whatever it says)."""
    return list(cfg.kernels) if registry.get(arch).ops else list(cfg.kernels)[:1]


def grid(cfg: DictConfig) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The points in their run order, (row labels, measurement arguments): the shortest lengths
    first, and at each length and batch size every model, kernel backend and form one after
    another, so that a grid cut short (a time limit, Ctrl-C) has measured the comparisons its
    figures draw."""
    common = {"device": cfg.device, "dtype": cfg.dtype, "seed": cfg.seed}
    models = models_of(cfg)
    sources = {entry: model_source(entry, cfg.model_size, cfg.get("model_variant")) for entry in models}
    with_kernels = [(name, kernels) for name in models for kernels in kernels_of(cfg, sources[name][0])]
    points = []
    if cfg.mode == "inference":
        grid_cfg = cfg.inference
        formats = [(weights, runtime) for runtime in runtimes_of(cfg) for weights in weights_of(cfg)]
        for gen_len, batch, (name, kernels), (weights, runtime) in itertools.product(
                sorted(grid_cfg.gen_lengths), grid_cfg.batch_sizes, with_kernels, formats):
            arch, variant, source = sources[name]
            labels = {"model": name, "arch": arch, "variant": variant, "kernels": kernels, "weights": weights,
                      "runtime": runtime,
                      "size": _size_label(cfg, name, arch), "batch": batch, "prompt_len": grid_cfg.prompt_len,
                      "gen_len": gen_len}
            arguments = {"model_cfg": source, "batch_size": batch, "prompt_len": grid_cfg.prompt_len,
                         "gen_len": gen_len, "repeats": grid_cfg.repeats, "warmup": grid_cfg.warmup,
                         "compile": cfg.compile, "cuda_graphs": cfg.cuda_graphs, "kernels": kernels,
                         "weights": weights, "runtime": runtime, **common}
            points.append((labels, arguments))
    else:
        grid_cfg = cfg.train
        variants = [(name, kernels, form, documents) for name, kernels in with_kernels
                    for form in train_forms(cfg, sources[name][0]) for documents in documents_of(grid_cfg)]
        for seq_len, (name, kernels, form, documents) in itertools.product(sorted(grid_cfg.seq_lens), variants):
            arch, variant, source = sources[name]
            for batch, checkpointing in train_batches(grid_cfg, seq_len):
                labels = {"model": name, "arch": arch, "variant": variant, "kernels": kernels, "form": form,
                          "documents": documents, "size": _size_label(cfg, name, arch), "batch": batch,
                          "seq_len": seq_len, "activation_checkpointing": checkpointing}
                arguments = {"model_cfg": source, "form": form, "batch_size": batch, "seq_len": seq_len,
                             "repeats": grid_cfg.repeats, "warmup": grid_cfg.warmup, "compile": cfg.compile,
                             "activation_checkpointing": checkpointing, "kernels": kernels, "documents": documents,
                             "document_tokens": grid_cfg.get("document_tokens", measure.DOCUMENT_TOKENS), **common}
                points.append((labels, arguments))
    return points


def weights_of(cfg: DictConfig) -> list[str]:
    """The weight formats each inference point is measured with (``weights``, a grid axis; results
    written before it had none: full)."""
    return list(dict.fromkeys(cfg.get("weights") or ["full"]))


def runtimes_of(cfg: DictConfig) -> list[str]:
    """What decodes each inference point (``runtimes``, a grid axis: torch, or onnx: the model
    exported and run by ONNX Runtime; results written before it had none: torch)."""
    return list(dict.fromkeys(cfg.get("runtimes") or ["torch"]))


def documents_of(grid_cfg: DictConfig) -> list[str]:
    """The documents settings each training point is measured in (``train.documents``, a grid
    axis; results written before it had none: joined)."""
    return list(dict.fromkeys(grid_cfg.get("documents") or ["joined"]))


def train_batches(grid_cfg: DictConfig, seq_len: int) -> list[tuple[int, bool]]:
    """(batch size, activation checkpointing) of the training points at ``seq_len``: ``batch_size``
    sequences (none when null); with ``tokens_per_step``, also ``tokens_per_step // seq_len`` of them
    (at least one), checkpointed with ``large_batch_checkpointing``: a realistic step (16 x 2048,
    4 x 8192, ...)."""
    batches = [] if grid_cfg.batch_size is None else [(grid_cfg.batch_size, False)]
    if grid_cfg.tokens_per_step:
        large = max(1, grid_cfg.tokens_per_step // seq_len)
        if large != grid_cfg.batch_size:
            batches.append((large, bool(grid_cfg.large_batch_checkpointing)))
    return batches


def _whole(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def grid_problems(cfg: DictConfig) -> list[str]:
    """What in the grid of ``cfg.mode`` cannot be measured: an empty list of models, of kernel
    backends (or one that cannot run on ``device``) or of lengths or batch sizes, a length or a
    batch below 1, repeats below 1, a negative warm-up."""
    problems = []
    kernels = cfg.get("kernels")
    if kernels is None or isinstance(kernels, str) or len(kernels) == 0 or any(value not in KERNELS for value in kernels):
        problems.append(f"kernels={kernels if kernels is None or isinstance(kernels, str) else list(kernels)} must be a "
                        f"list of some of {', '.join(KERNELS)}, e.g. kernels=[torch,fla] (each model measured with each)")
    else:
        problems += [problem for value in dict.fromkeys(kernels) if (problem := kernels_problem(value, cfg.device))]
    weights = cfg.get("weights")
    if weights is not None and (isinstance(weights, str) or len(weights) == 0
                                or any(value not in WEIGHT_FORMATS for value in weights)):
        problems.append(f"weights={weights if isinstance(weights, str) else list(weights)} must be a list of some of "
                        f"{', '.join(WEIGHT_FORMATS)}, e.g. weights=[full,int8] (each inference point measured with each)")
    elif weights is not None and list(weights) != ["full"]:
        if cfg.mode == "train":
            problems.append(f"weights={list(weights)}: quantized weights are for decoding (mode=inference); "
                            "training measures weights=[full]")
        for value in dict.fromkeys(weights):
            try:
                check_weight_format(value, None, cfg.device)
            except MCSDError as error:
                problems.append(str(error))
    runtimes = cfg.get("runtimes")
    if runtimes is not None and (isinstance(runtimes, str) or len(runtimes) == 0
                                 or any(value not in RUNTIMES for value in runtimes)):
        problems.append(f"runtimes={runtimes if isinstance(runtimes, str) else list(runtimes)} must be a list of some of "
                        f"{', '.join(RUNTIMES)}, e.g. runtimes=[torch,onnx] (each inference point decoded by each)")
    elif runtimes is not None and "onnx" in runtimes:
        if cfg.mode == "train" or not cfg.device.startswith("cpu"):
            problems.append(f"runtimes={list(runtimes)}: ONNX Runtime decodes on the CPU (mode=inference device=cpu)")
        else:
            try:
                check_onnx_installed()
            except MCSDError as error:
                problems.append(str(error).replace("format=onnx", "runtimes=[onnx]"))
    variant = cfg.get("model_variant")
    known = [name for arch in registry.architectures() for name in registry.get(arch).variants]
    if variant is not None and variant not in known:
        problems.append(f"model_variant={variant} is a variant of no registered architecture: use one of "
                        f"{', '.join(dict.fromkeys(known))} (or null)")
    if cfg.models is not None and len(cfg.models) == 0:
        problems.append("models=[] names no model: list some (models=[mcsd,transformer]) or models=null for every "
                        "registered architecture")
    grid_cfg = cfg.inference if cfg.mode == "inference" else cfg.train
    lists = ("batch_sizes", "gen_lengths") if cfg.mode == "inference" else ("seq_lens",)
    for key in lists:
        values = grid_cfg.get(key)
        if values is None or len(values) == 0:
            problems.append(f"{cfg.mode}.{key}={'[]' if values is not None else 'null'} measures nothing: give at least "
                            f"one value, e.g. {cfg.mode}.{key}=[{1 if key == 'batch_sizes' else 128}]")
        elif not all(_whole(value, 1) for value in values):
            problems.append(f"{cfg.mode}.{key}={list(values)} must be whole numbers of at least 1")
    numbers = {"repeats": 1, "warmup": 0, **({"prompt_len": 1} if cfg.mode == "inference" else {})}
    if cfg.mode == "train":
        numbers |= {key: 1 for key in ("batch_size", "tokens_per_step") if grid_cfg.get(key) is not None}
        documents = grid_cfg.get("documents")
        if documents is not None and (isinstance(documents, str) or len(documents) == 0
                                      or any(value not in DOCUMENTS for value in documents)):
            problems.append(f"train.documents={documents if isinstance(documents, str) else list(documents)} "
                            f"must be a list of some of {', '.join(DOCUMENTS)}, e.g. train.documents=[joined,apart] "
                            "(each point measured with each)")
        if grid_cfg.get("document_tokens") is not None:
            numbers["document_tokens"] = 1
    for key, least in numbers.items():
        if not _whole(grid_cfg.get(key), least):
            problems.append(f"{cfg.mode}.{key}={grid_cfg.get(key)} must be a whole number of at least {least}")
    return problems


def _check(cfg: DictConfig) -> None:
    if cfg.mode not in MODES:
        raise MCSDError(f"mode={cfg.mode!r} is unknown: use inference or train")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise MCSDError(f"device={cfg.device} but no GPU is visible: use device=cpu (e.g. bench=cpu_quick)")
    problems = grid_problems(cfg)  # imports fla's kernels (seconds) where the grid asks for them
    if problems:
        raise MCSDError("\n".join(problems))
    if cfg.get("resume") and cfg.get("overwrite"):
        raise MCSDError("resume=true keeps the results in output_dir and overwrite=true replaces them: give one of them")
    if cfg.busy_machine not in BUSY_MACHINE:
        raise MCSDError(f"busy_machine={cfg.busy_machine!r} is unknown: use {', '.join(BUSY_MACHINE)}")
    budget = cfg.get("time_budget_s")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0):
        raise MCSDError(f"time_budget_s={budget} must be a number of seconds above 0, or null (no budget)")
    if cfg.mode == "train" and cfg.train.batch_size is None and not cfg.train.tokens_per_step:
        raise MCSDError("train.batch_size=null and train.tokens_per_step=null leave no training point: set either")
    if cfg.dtype not in measure.DTYPES:
        raise MCSDError(f"dtype={cfg.dtype!r} is unknown: use one of {', '.join(measure.DTYPES)}")
    if cfg.cuda_graphs and not cfg.device.startswith("cuda"):
        raise MCSDError(f"cuda_graphs=true replays CUDA graphs, which device={cfg.device} has not: set cuda_graphs=false")
    if cfg.wandb.enabled and not cfg.wandb.offline:
        require_wandb_login("wandb")
    for entry in models_of(cfg):
        if entry not in registry.architectures() and not Path(entry).expanduser().exists():
            raise MCSDError(f"models: {entry!r} is neither a registered architecture ({', '.join(registry.architectures())}) "
                            "nor a saved model (a model folder, an mcsd-train run directory or a .ckpt) nor a run's config YAML")


BUSY_MACHINE = ("refuse", "wait", "measure")
BUSY_WAIT_S = 600  # busy_machine=wait waits this long at most, sampling every BUSY_POLL_S
BUSY_POLL_S = 5


def check_machine(cfg: DictConfig) -> float | None:
    """Before the grid: the cores other work keeps busy (:func:`mcsd.bench.load.sample_other_cores`);
    above ``busy_cores``, refuse in one line (``busy_machine=refuse``), wait for the work to stop
    (``wait``, at most :data:`BUSY_WAIT_S`), or go on with a warning (``measure``)."""
    others = sample_other_cores()
    if others is None or others <= cfg.busy_cores:
        return others
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    busy = (f"other work keeps {others:.1f} of this machine's {cores} cores busy (more than busy_cores="
            f"{cfg.busy_cores}), which would slow every point by an amount nobody knows")
    if cfg.busy_machine == "measure":
        log.warning("%s: measuring anyway (busy_machine=measure); each row says what it shared (other_cores)", busy)
        return others
    if cfg.busy_machine == "wait":
        waited = 0.0
        while others is not None and others > cfg.busy_cores and waited < BUSY_WAIT_S:
            print(f"mcsd-bench: waiting for the machine: {others:.1f} cores busy with other work "
                  f"({waited:.0f} of at most {BUSY_WAIT_S} s)", flush=True)
            time.sleep(BUSY_POLL_S)
            waited += BUSY_POLL_S + 1
            others = sample_other_cores()
        if others is None or others <= cfg.busy_cores:
            return others
        busy += f" after waiting {BUSY_WAIT_S} s"
    raise MCSDError(f"{busy}: let it finish (busy_machine=wait waits for it), or busy_machine=measure to measure "
                    "anyway (each row records other_cores)")


def header(cfg: DictConfig) -> dict[str, Any]:
    """What machine and software the results come from."""
    device = torch.cuda.get_device_name(torch.device(cfg.device)) if cfg.device.startswith("cuda") else (
        f"{platform.processor() or platform.machine()} CPU, {cfg.threads or torch.get_num_threads()} threads")
    return {"mode": cfg.mode, "device": device, "dtype": cfg.dtype, "torch": torch.__version__,
            "git_commit": git_commit(), "bench": cfg.name, "compile": cfg.compile, "cuda_graphs": cfg.cuda_graphs}


RESULT_FILES = ("results.json", "results.csv")  # what a grid writes into its output_dir


def write_results(output_dir: Path, head: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[Path, Path]:
    """``results.json`` (header + points) and the tidy ``results.csv`` (header fields as columns)."""
    import pandas as pd

    output_dir.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = (output_dir / name for name in RESULT_FILES)
    json_path.write_text(json.dumps({"header": head, "points": rows}, indent=2) + "\n")
    columns = COLUMNS[head["mode"]]
    frame = pd.DataFrame(rows).reindex(columns=columns)
    for key in ("device", "dtype", "torch", "compile", "cuda_graphs", "complete", "points_planned", "stopped_by"):
        frame[key] = head[key]
    # The dtype each point ran in (int4, and int8 on a CPU, run in bfloat16 whatever dtype says): the row's own.
    frame["dtype"] = [row.get("dtype", head["dtype"]) for row in rows]
    # A resumed grid's rows come from several runs: each row's own commit (rows written before rows had one: the header's).
    frame["git_commit"] = [row.get("git_commit", head["git_commit"]) for row in rows]
    frame.to_csv(csv_path, index=False)
    return json_path, csv_path


def _measure(cfg: DictConfig, head: dict[str, Any], points: list, to_measure: list, rows: list[dict[str, Any]],
             output_dir: Path, isolate: bool, wandb_run: Any) -> tuple[Path, Path, bool]:
    """Measure ``to_measure``'s points into ``rows`` (each written as it is measured, and logged to
    ``wandb_run``, a :class:`~mcsd.training.dashboard.MeasurementRun`, with ``wandb.enabled``); the
    result files and whether Ctrl-C stopped it."""
    budget = PointBudget(cfg.time_budget_s)
    bar = tqdm(to_measure, desc=f"mcsd-bench {cfg.mode}", unit="point")
    # Ctrl-C: stop after the point under way (again: at once); the points measured are kept.
    with StopAfterCurrent(lambda: bar.set_description(f"mcsd-bench {cfg.mode} (Ctrl-C: stopping after this point)")
                          ) as stop:
        for labels, arguments in bar:
            if not budget.allows(arguments):
                log.warning("time_budget_s=%s: the next point (%s) would end past it (about %.0f s more after %.0f s): "
                            "the grid stops here, %d of %d points measured (complete=false)", cfg.time_budget_s,
                            " ".join(f"{key}={value}" for key, value in labels.items()), budget.estimate(arguments),
                            budget.elapsed(), measured(rows, points), len(points))
                head["stopped_by"] = f"time_budget_s={cfg.time_budget_s}"
                break
            # The machine's limit right before each point (this process is idle while a point runs):
            # on a shared machine it moves by a third between minutes, so each point has its own.
            limit = (measure.matmul_peak_flops(cfg.device, cfg.dtype, cfg.train.peak_matmul_size) if cfg.mode == "train"
                     else measure.read_bandwidth_bytes_per_s(cfg.device))
            start = read_clock()
            began = time.monotonic()
            result = run_point(cfg.mode, arguments, isolate, cfg.memory_limit_mb, cfg.threads)
            result = {**result, "point_s": time.monotonic() - began, "git_commit": head["git_commit"],
                      "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
            budget.record(arguments, result["point_s"])
            others = other_cores(start, read_clock())  # the point's own process and its children left out
            if others is not None:
                result = {**result, "other_cores": others, "shared": others > cfg.busy_cores}
            peak = mfu_peak(cfg.device.split(":")[0], device_name(cfg.device), cfg.dtype, limit) if cfg.mode == "train" else None
            rows.append(_row(cfg.mode, labels, result, limit, peak))
            write_results(output_dir, head, rows)  # after every point: a crash or a kill loses none measured
            if cfg.wandb.enabled:
                point = "/".join(f"{key}={value}" for key, value in labels.items())
                wandb_run.record(rows[-1], {f"tokens_per_s/{point}": rows[-1].get("tokens_per_s")})
            if stop.requested:
                head["stopped_by"] = "Ctrl-C"
                break
    bar.close()
    head["complete"] = measured(rows, points) == len(points)
    json_path, csv_path = write_results(output_dir, head, rows)
    return json_path, csv_path, stop.requested


def bench(cfg: DictConfig) -> Path:
    """Run the grid of ``cfg`` and write its results; return the CSV's path."""
    _check(cfg)
    if isinstance(cfg.threads, str):  # threads=auto (not through the command): a number, for the points too
        apply_threads("mcsd-bench", cfg)
    isolate = cfg.isolate if cfg.isolate is not None else not cfg.device.startswith("cuda")
    if cfg.threads:  # the peak and the bandwidth on the points' own thread count
        torch.set_num_threads(cfg.threads)
    points = grid(cfg)
    output_dir = Path(cfg.output_dir)
    head = {**header(cfg), "complete": False, "points_planned": len(points), "stopped_by": None}
    if not cfg.get("resume"):
        replace_earlier_results(output_dir, list(RESULT_FILES), "mcsd-bench", cfg.get("overwrite", False),
                                resume="resume=true to keep its rows and measure only the points they lack")
    rows = resumed_rows(output_dir, head) if cfg.get("resume") else []
    to_measure = [(labels, arguments) for labels, arguments in points if not any(is_row_of(row, labels) for row in rows)]
    if rows:
        log.info("resume=true: %d of the %d points already measured in %s, %d to measure", len(points) - len(to_measure),
                 len(points), output_dir, len(to_measure))
    head["other_cores_before"] = check_machine(cfg)
    # Imported here, not with the module: each point's fresh process imports this module, and its
    # measured peak memory would carry Lightning's, W&B's and pandas' imports.
    import pandas as pd

    from mcsd.training.dashboard import MeasurementRun

    models = [str(model) for model in cfg.get("models") or []]
    wandb_run = MeasurementRun("bench", cfg.wandb, head, output_dir, models) if cfg.wandb.enabled else contextlib.nullcontext()
    with wandb_run:
        json_path, csv_path, stopped = _measure(cfg, head, points, to_measure, rows, output_dir, isolate, wandb_run)
        if cfg.wandb.enabled:
            wandb_run.table(f"bench/{cfg.mode}", pd.read_csv(csv_path))
            wandb_run.record({}, {"points_measured": measured(rows, points), "points_planned": len(points),
                                  "complete": head["complete"]})
        if stopped:
            interrupted("mcsd-bench", f"kept the {measured(rows, points)} of {len(points)} points measured in {csv_path} "
                        f"and {json_path.name} (complete=false; mcsd-plot {cfg.mode} draws them; resume=true measures "
                        "the rest)")
    shared = [row for row in rows if row.get("shared")]
    unsteady = [row for row in rows if row.get("unsteady")]
    if shared:
        log.warning("%d of %d points ran while other work kept more than %s cores busy (column other_cores): their "
                    "times are the shared machine's, not this one's", len(shared), len(rows), cfg.busy_cores)
    if unsteady:
        log.warning("%d of %d points' repeats spread by more than %.0f%% of their median (column unsteady): measure "
                    "them again", len(unsteady), len(rows), 100 * SPREAD_LIMIT)
    print(f"results: {csv_path} and {json_path}\nplot: mcsd-plot {cfg.mode} {csv_path}", flush=True)
    return csv_path


RESUME_MUST_MATCH = ("mode", "device", "dtype", "torch", "compile", "cuda_graphs")  # header fields a resumed grid keeps


def resumed_rows(output_dir: Path, head: dict[str, Any]) -> list[dict[str, Any]]:
    """``resume=true``: the rows of the results already in ``output_dir`` (none there: none), which
    the grid keeps and does not measure again; refused in one line when they were measured on
    another device, thread count, dtype, torch or compile setting (:data:`RESUME_MUST_MATCH`), whose
    numbers would not compare with the new rows'."""
    path = output_dir / "results.json"
    if not path.is_file():
        return []
    try:
        earlier = json.loads(path.read_text())
        earlier_head, rows = earlier["header"], list(earlier["points"])
    except (ValueError, KeyError, TypeError):
        raise MCSDError(f"resume=true: {path} is not an mcsd-bench results file: give an output_dir of a grid to "
                        "resume, or resume=false") from None
    for key in RESUME_MUST_MATCH:
        if earlier_head.get(key) != head[key]:
            raise MCSDError(f"resume=true: the results in {output_dir} were measured with {key}={earlier_head.get(key)!r} "
                            f"and this grid has {key}={head[key]!r}: resume with the same setting, or give another "
                            "output_dir")
    return [{**row, "git_commit": row.get("git_commit", earlier_head.get("git_commit"))} for row in rows]


def is_row_of(row: dict[str, Any], labels: dict[str, Any]) -> bool:
    """Whether ``row`` is the measurement of the point that ``labels`` name."""
    return all(row.get(key) == value for key, value in labels.items())


def measured(rows: list[dict[str, Any]], points: list[tuple[dict[str, Any], dict[str, Any]]]) -> int:
    """How many of the grid's ``points`` ``rows`` measure."""
    return sum(any(is_row_of(row, labels) for row in rows) for labels, _ in points)


def point_work(arguments: dict[str, Any]) -> float:
    """A point's work in the units its time grows with: the tokens it decodes (warm-up passes,
    which with CUDA graphs decode the whole length, and repeats; each row of a batch in step) or
    trains on (warm-up and repeated steps of batch x seq_len)."""
    if "gen_len" in arguments:
        warmup = arguments["gen_len"] if arguments.get("cuda_graphs") else min(arguments["gen_len"], 16)
        passes = max(arguments["warmup"], 1 if arguments.get("compile") or arguments.get("cuda_graphs") else 0)
        return arguments["prompt_len"] + passes * warmup + arguments["repeats"] * arguments["gen_len"]
    return (max(arguments["warmup"], 1) + arguments["repeats"]) * arguments["batch_size"] * arguments["seq_len"]


class PointBudget:
    """``time_budget_s``: the grid starts a point only when the time spent so far and the point's
    estimate fit in it. The estimate scales the seconds per unit of :func:`point_work` of the
    latest point of the same model (else of any model) to this point's work; the first point of
    all is always run. ``None``: no budget."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds, self.started = seconds, time.monotonic()
        self.rates: dict[str, float] = {}  # seconds per unit of work, by model

    @staticmethod
    def _model(arguments: dict[str, Any]) -> str:
        return json.dumps(arguments["model_cfg"], sort_keys=True, default=str)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def estimate(self, arguments: dict[str, Any]) -> float:
        rate = self.rates.get(self._model(arguments), max(self.rates.values(), default=0.0))
        return rate * point_work(arguments)

    def allows(self, arguments: dict[str, Any]) -> bool:
        return self.seconds is None or not self.rates or self.elapsed() + self.estimate(arguments) <= self.seconds

    def record(self, arguments: dict[str, Any], seconds: float) -> None:
        self.rates[self._model(arguments)] = seconds / point_work(arguments)


def device_name(device: str) -> str:
    """The GPU's name (``torch.cuda.get_device_name``), or ``cpu``."""
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"


def _row(mode: str, labels: dict[str, Any], result: dict[str, Any], limit: float,
         peak: tuple[float, str] | None) -> dict[str, Any]:
    """A point's row: its labels, its measurement, and its use of the machine's ``limit`` (the
    measured matmul peak or read bandwidth); in training, MFU over ``peak`` (FLOP/s, source:
    :func:`mcsd.bench.peaks.mfu_peak`)."""
    row = {**labels, **result}
    if mode == "train" and result["status"] == "ok":
        row["matmul_peak_flops"] = limit
        row["peak_flops"], row["peak_source"] = peak
        row["mfu"] = result["model_flops"] / result["step_s"] / row["peak_flops"]  # CausalLM.training_flops
    if mode == "inference" and result["status"] == "ok":  # a decoding step over the time to read what it must once
        row["read_bandwidth_bytes_per_s"] = limit
        row["limit_ratio"] = result["decode_s_per_token"] / (result["step_read_bytes"] / limit)
    notes = "".join([f", shared with {row['other_cores']:.1f} cores of other work" if row.get("shared") else "",
                     ", unsteady repeats" if row.get("unsteady") else ""])
    log.info("%s: %s%s", " ".join(f"{key}={value}" for key, value in labels.items()),
             f"{row['tokens_per_s']:.0f} tokens/s, peak {row['peak_mem_bytes'] / 2**20:.0f} MiB"
             if result["status"] == "ok" else f"{result['status']} ({result['reason']})", notes)
    return row


