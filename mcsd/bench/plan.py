"""The bench's plan: the points a grid measures, in their run order, from the config (each a
point's labels, the columns :data:`mcsd.checkpoint.bench_results.LABELS` names, and the
arguments its measurement takes), and what in a grid cannot be measured.

A new grid axis is one change here (its values, in :func:`plan`) and one column in the schema
(:data:`mcsd.checkpoint.bench_results.LABELS`).
"""

from __future__ import annotations

import itertools
from typing import Any

from omegaconf import DictConfig

from mcsd.bench.training_step import DOCUMENT_TOKENS
from mcsd.checkpoint.bench_results import LABELS
from mcsd.checkpoint.model_source import ModelSource, resolve
from mcsd.data.tokens import DOCUMENTS
from mcsd.deploy.onnx import check_onnx_installed
from mcsd.deploy.quantize import WEIGHT_FORMATS, check_weight_format
from mcsd.errors import MCSDError
from mcsd.models import registry
from mcsd.ops.kernels import KERNELS, kernels_problem
RUNTIMES = ("torch", "onnx")


def models_of(cfg: DictConfig) -> list[str]:
    """The ``models`` entries to bench: as listed, or (null) every registered architecture."""
    return list(cfg.models) if cfg.models is not None else registry.architectures()


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


def kernels_of(cfg: DictConfig, arch: str) -> list[str]:
    """The ``kernels`` an entry of architecture ``arch`` is measured with: each of the list where
    its mixers run ops that fla serves (:attr:`Architecture.fla_ops`), else the first alone (the
    Transformer computes the same whatever it says)."""
    return list(cfg.kernels) if registry.get(arch).fla_ops else list(cfg.kernels)[:1]


def _model_labels(entry: str, source: ModelSource, size: str) -> dict[str, str]:
    """A row's labels of its model: the entry as given, its architecture, variant and size."""
    return {"model": entry, "arch": source.architecture.name, "variant": source.variant,
            "size": source.size_label(size)}


def plan(cfg: DictConfig) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The points in their run order, (row labels, measurement arguments): the shortest lengths
    first, and at each length and batch size every model, kernel backend and form one after
    another, so that a grid cut short (a time limit, Ctrl-C) has measured the comparisons its
    figures draw."""
    common = {"device": cfg.device, "dtype": cfg.dtype, "seed": cfg.seed}
    models = models_of(cfg)
    sources = {entry: resolve(entry, cfg.model_size, cfg.get("model_variant")) for entry in models}
    with_kernels = [(name, kernels) for name in models for kernels in kernels_of(cfg, sources[name].architecture.name)]
    points = []
    if cfg.mode == "inference":
        grid_cfg = cfg.inference
        formats = [(weights, runtime) for runtime in runtimes_of(cfg) for weights in weights_of(cfg)]
        for gen_len, batch, (name, kernels), (weights, runtime) in itertools.product(
                sorted(grid_cfg.gen_lengths), grid_cfg.batch_sizes, with_kernels, formats):
            labels = {**_model_labels(name, sources[name], cfg.model_size), "kernels": kernels, "weights": weights,
                      "runtime": runtime, "batch": batch, "prompt_len": grid_cfg.prompt_len, "gen_len": gen_len}
            arguments = {"model_cfg": sources[name].spec, "batch_size": batch, "prompt_len": grid_cfg.prompt_len,
                         "gen_len": gen_len, "repeats": grid_cfg.repeats, "warmup": grid_cfg.warmup,
                         "compile": cfg.compile, "cuda_graphs": cfg.cuda_graphs, "kernels": kernels,
                         "weights": weights, "runtime": runtime, **common}
            points.append(({key: labels[key] for key in LABELS[cfg.mode]}, arguments))
    else:
        grid_cfg = cfg.train
        variants = [(name, kernels, form, documents) for name, kernels in with_kernels
                    for form in train_forms(cfg, sources[name].architecture.name) for documents in documents_of(grid_cfg)]
        for seq_len, (name, kernels, form, documents) in itertools.product(sorted(grid_cfg.seq_lens), variants):
            for batch, checkpointing in train_batches(grid_cfg, seq_len):
                labels = {**_model_labels(name, sources[name], cfg.model_size), "kernels": kernels, "form": form,
                          "documents": documents, "batch": batch, "seq_len": seq_len,
                          "activation_checkpointing": checkpointing}
                arguments = {"model_cfg": sources[name].spec, "form": form, "batch_size": batch, "seq_len": seq_len,
                             "repeats": grid_cfg.repeats, "warmup": grid_cfg.warmup, "compile": cfg.compile,
                             "activation_checkpointing": checkpointing, "kernels": kernels, "documents": documents,
                             "document_tokens": grid_cfg.get("document_tokens", DOCUMENT_TOKENS), **common}
                points.append(({key: labels[key] for key in LABELS[cfg.mode]}, arguments))
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


def point_work(arguments: dict[str, Any]) -> float:
    """A point's work in the units its time grows with: the tokens it decodes (warm-up passes,
    which with CUDA graphs decode the whole length, and repeats; each row of a batch in step) or
    trains on (warm-up and repeated steps of batch x seq_len)."""
    if "gen_len" in arguments:
        warmup = arguments["gen_len"] if arguments.get("cuda_graphs") else min(arguments["gen_len"], 16)
        passes = max(arguments["warmup"], 1 if arguments.get("compile") or arguments.get("cuda_graphs") else 0)
        return arguments["prompt_len"] + passes * warmup + arguments["repeats"] * arguments["gen_len"]
    return (max(arguments["warmup"], 1) + arguments["repeats"]) * arguments["batch_size"] * arguments["seq_len"]
