"""mcsd-probe: probes of a trained model.

    mcsd-probe context ckpt=logs/train/runs/<run> data=text_files data.paths=[held_out.txt]
    mcsd-probe context ckpt=... data=wikitext103 length=8192 windows=[64,256,1024,4096]
    mcsd-probe context ckpt=... paths.output_dir=<an interrupted probe> resume=true   # only the documents it left

``context`` writes ``context_curve.csv`` (loss by position), ``context_delta.csv`` (Delta_N and
the swapped control per N), ``context_losses.safetensors`` (the losses of the documents read,
after every batch: what ``resume=true`` goes on from) and ``context_probe.png/pdf`` to its run
folder (``logs/probe_context/runs/<time>/``); ``mcsd-plot context source=DIR`` draws several side by side.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer

from mcsd.checkpoint import probe_results
from mcsd.checkpoint.run_folder import RunFolder
from mcsd.checkpoint.saved_model import SavedModel, load, load_tokenizer, locate
from mcsd.commands.app import fail, hydra_app, refuse_onnx_export
from mcsd.runtime import interrupted, require_wandb_login
from mcsd.data.corpus import DataError
from mcsd.data.datamodule import corpus_sources
from mcsd.data.tokenizer import EOS_TOKEN
from mcsd.errors import MCSDError
from mcsd.files import replace_earlier_results
from mcsd.jobs import CTRL_C, run_jobs
from mcsd.models import CausalLM
from mcsd.plots.context import markdown_context_table, plot_context
from mcsd.plots.runs import curve_key, curve_label
from mcsd.precision import check_device, model_dtype
from mcsd.probes.context import ContextLosses, ContextProbe, ContextProbePlan
from mcsd.training.dashboard import EXIT_INTERRUPTED, MeasurementRun


# The fields of a data node that say which corpus it reads (its documents and how they are cut).
CORPUS_FIELDS = ("source", "paths", "hub_path", "hub_subset", "splits", "sample_by", "text_field", "max_documents")


@dataclasses.dataclass
class ProbeDocuments:
    """The probe's pieces ``[D, length]`` and what they are, in words (which split of which corpus,
    and whether the model trained on them)."""

    pieces: torch.Tensor
    what: str


def _pieces(documents: Iterator[list[int]], length: int, count: int) -> list[list[int]]:
    """The first ``count`` consecutive, non-overlapping pieces of ``length`` tokens of ``documents``."""
    pieces: list[list[int]] = []
    for ids in documents:
        pieces += [ids[start:start + length] for start in range(0, len(ids) - length + 1, length)]
        if len(pieces) >= count:
            break
    return pieces[:count]


def trained_data(saved: SavedModel) -> dict[str, Any] | None:
    """The resolved ``data`` node the run of ``saved`` trained on (its logged config), or None for a
    model saved outside a run or a run that logged no config."""
    run = saved.run_directory
    logged = RunFolder(run).logged_config() if run is not None else None
    data = (logged or {}).get("data")
    return data if isinstance(data, dict) else None


def held_out_documents(trained: dict[str, Any], tokenizer: Tokenizer) -> tuple[str, int, Iterator[list[int]]]:
    """The documents the run held out of its training (its test split, else its validation split),
    as it drew them: the split's name, its count of documents and their tokens (each after its
    separator, as in training)."""
    from hydra.utils import instantiate

    splits = instantiate(trained, tokenizer=tokenizer).build()
    name = "test" if splits["test"].documents else "val"
    split = splits[name]
    return name, split.documents, (split.store.document(int(number)).tolist() for number in split.document_ids)


def probe_documents(data: DictConfig, tokenizer: Tokenizer, length: int, count: int, cache_dir: str | Path,
                    trained: dict[str, Any] | None = None) -> ProbeDocuments:
    """The first ``count`` pieces of ``length`` tokens of the corpus ``data`` names, each document
    tokenized as in training (after ``<|endoftext|>`` when the data config separates documents) and
    cut into consecutive non-overlapping pieces (its remainder dropped). Held-out documents where
    there are enough: where ``data`` is the corpus the model trained on (``trained``, its run's data
    node), the documents the run held out of training; else a corpus's own test split where it
    names one (WikiText-103's), else its documents in order."""
    if "source" not in data:
        raise MCSDError(f"data={data.get('name', '?')} has no text documents: probe on a text corpus "
                        "(data=embedded, data=text_files data.paths=[...], data=wikitext103)")
    data = OmegaConf.to_container(data, resolve=True) if isinstance(data, DictConfig) else dict(data)
    name = data.get("name", "?")
    same = trained is not None and "source" in trained and all(data.get(field) == trained.get(field)
                                                                 for field in CORPUS_FIELDS)
    note = ""
    if same:  # its documents tokenized as the run's were, into this command's cache
        split, held, documents = held_out_documents({**trained, "cache_dir": str(cache_dir)}, tokenizer)
        pieces = _pieces(documents, length, count)
        if len(pieces) >= 2:
            return ProbeDocuments(torch.tensor(pieces), f"the {split} documents the run held out of training "
                                                        f"(data={name}, {held} documents)")
        note = (f"; its held-out {split} documents make {len(pieces)} piece(s) of length={length} tokens, fewer than "
                "the 2 the probe needs: lower length for held-out text")
    if data.get("sample_by") == "auto":  # long documents: a lone file is one, not its paragraphs
        data = {**data, "sample_by": "document"}
    sources = corpus_sources(data, Path(cache_dir).expanduser() / "hf")
    split = "test" if "test" in sources else "train"  # a corpus's own test split where it has one
    eos = tokenizer.token_to_id(EOS_TOKEN) if data.get("separate_documents", True) else None
    texts = itertools.chain.from_iterable(sources[split].documents())
    pieces = _pieces((([eos] if eos is not None else []) + tokenizer.encode(text).ids for text in texts), length, count)
    if len(pieces) < 2:
        raise DataError(f"data={name} has {len(pieces)} piece(s) of length={length} tokens; the "
                        "probe needs at least 2: lower length or give longer documents")
    if split == "test":
        what = f"data={name}'s own test split"
    elif same:
        what = f"data={name}'s documents in order, which the model trained on{note}"
    elif trained is not None:
        what = f"data={name}'s documents in order (not the corpus the model trained on)"
    else:
        what = f"data={name}'s documents in order (the model's training data is not recorded beside it)"
    return ProbeDocuments(torch.tensor(pieces), what)


def model_identity(model: CausalLM) -> dict[str, str]:
    """The architecture, variant and curve label of a loaded model."""
    architecture = model.architecture
    variant = architecture.variant_of(dataclasses.asdict(model.config))
    return {"arch": architecture.name, "variant": variant,
            "label": curve_label("ablation", curve_key(architecture.name, variant), None)}


def write_context_probe(result: ContextProbe, source: dict[str, str], output_dir: Path) -> list[Path]:
    """``context_curve.csv``, ``context_delta.csv`` (each row tagged with ``source``: the model's
    identity, checkpoint and form) and the figure, in ``output_dir``."""
    curve, deltas = result.curve.assign(**source), result.deltas.assign(**source)
    return [*probe_results.write(output_dir, curve, deltas), *plot_context(curve, deltas, output_dir)]


def context(cfg: DictConfig) -> ContextProbe:
    """Probe ``cfg.ckpt`` on ``cfg.data``'s documents, a batch of them at a time (each batch's
    losses written as it finishes); write the CSVs and the figure. Ctrl-C stops after the batch
    under way (again: at once) and writes the probe of the documents finished; ``resume=true``
    reads only the documents an earlier probe in ``output_dir`` left unread."""
    if cfg.wandb.enabled and not cfg.wandb.offline:
        require_wandb_login("wandb")
    check_device(cfg.device)
    refuse_onnx_export("mcsd-probe context", cfg.ckpt, "give the model folder or run it was exported from")
    output_dir = Path(cfg.output_dir)
    replace_earlier_results(output_dir, list(probe_results.RESULT_FILES), "mcsd-probe context",
                            cfg.get("overwrite", False), resume="resume=true to read only the documents it left unread",
                            resuming=bool(cfg.get("resume")))
    windows = sorted(int(window) for window in cfg.windows)
    if not windows or windows[0] < 1:
        raise MCSDError(f"windows={list(cfg.windows)} must be positive token counts, e.g. windows=[64,256,1024]")
    saved = locate(cfg.ckpt)  # read once for the model, its tokenizer and its run
    model = load(saved, device=cfg.device, dtype=model_dtype(cfg.dtype, cfg.device))
    forms = model.architecture.forms
    if cfg.form is not None and cfg.form not in forms:
        raise MCSDError(f"form={cfg.form} is not a form of this model: use one of {', '.join(forms)} (or null)")
    identity = model_identity(model)
    read = probe_documents(cfg.data, load_tokenizer(saved), int(cfg.length), int(cfg.num_documents),
                           cfg.paths.cache_dir, trained_data(saved))
    plan = ContextProbePlan(model, read.pieces.to(cfg.device), windows, cfg.num_positions, cfg.batch_size, cfg.form,
                            cfg.max_tokens)
    source = {**identity, "ckpt": str(Path(cfg.ckpt).resolve()), "form": plan.form}
    settings = {"ckpt": source["ckpt"], "form": plan.form, "windows": plan.windows, "positions": plan.positions,
                "documents": probe_results.documents_digest(read.pieces)}
    earlier = probe_results.resumed_losses(output_dir, settings) if cfg.get("resume") else None
    losses = ContextLosses(**earlier) if earlier is not None else None
    done = losses.documents if losses is not None else 0
    print(f"probing {identity['label']} on {len(read.pieces)} pieces of {plan.length} tokens: {read.what}"
          + (f" ({done} read by the run resumed)" if earlier is not None else ""), flush=True)

    def read_batch(start: int, bar: Any) -> None:
        nonlocal losses
        batch = plan.losses(start, bar)
        losses = batch if losses is None else losses.then(batch)
        probe_results.write_losses(output_dir, losses.tensors(), settings)  # a run killed keeps the batches read

    outcome = run_jobs(plan.batches(done), read_batch, desc="context probe", each="batch of documents", unit="token",
                       work=plan.tokens, done=plan.read_tokens(done))
    if losses is None:
        interrupted("mcsd-probe context", "stopped before the probe had read a batch of documents: nothing written")
    result = plan.summary(losses, cfg.bootstrap, cfg.seed)
    paths = write_context_probe(result, source, output_dir)
    stopped = outcome.stopped_by == CTRL_C
    if cfg.wandb.enabled:  # before an interruption's exit too: the documents probed are kept there as here
        _log_to_wandb(cfg, result, paths[2], stopped)
    if stopped:
        interrupted("mcsd-probe context", f"kept the probe of the {losses.documents} of {len(read.pieces)} documents "
                    f"finished in {output_dir} (documents={losses.documents} in {probe_results.DELTA_FILE}; "
                    f"resume=true paths.output_dir={output_dir} reads the rest)")
    print(markdown_context_table(result.deltas.assign(**source)))
    print("\n".join(str(path) for path in paths))
    return result


def _log_to_wandb(cfg: DictConfig, result: ContextProbe, figure: Path, stopped: bool) -> None:
    """The probe as a W&B run (:class:`MeasurementRun`): Delta_N per window in its summary
    (``probe/delta_<N>``, with its interval), its tables and figure; ``stopped`` (by Ctrl-C): it ends 130."""
    import wandb

    settings = {key: OmegaConf.to_container(cfg[key]) if OmegaConf.is_config(cfg[key]) else cfg[key]
                for key in ("ckpt", "length", "windows", "num_documents", "num_positions", "form", "seed")}
    with MeasurementRun("probe_context", cfg.wandb, {**settings, "data": cfg.data.get("name")},
                        Path(cfg.output_dir), [cfg.ckpt]) as run:
        for row in result.deltas.to_dict("records"):
            window = int(row["window"])
            run.record(row, {f"probe/delta_{window}": row["delta"], f"probe/delta_{window}_low": row["delta_low"],
                             f"probe/delta_{window}_high": row["delta_high"]})
        run.table("probe/context_delta", result.deltas)
        run.table("probe/context_curve", result.curve)
        run.record({}, {"probe/documents": int(result.deltas["documents"].iloc[0])})
        run.run.log({"probe/figure": wandb.Image(str(figure))})
        run.exit_code = EXIT_INTERRUPTED if stopped else 0


@hydra_app("mcsd-probe context", "probe_context")
def _context_main(cfg: DictConfig) -> None:
    context(cfg)


PROBES = {"context": _context_main}


def main() -> None:
    """Entry point of ``mcsd-probe``: the first argument names the probe, Hydra reads the rest."""
    if len(sys.argv) < 2 or sys.argv[1] not in PROBES:
        fail("mcsd-probe", f"name a probe first: mcsd-probe {{{','.join(PROBES)}}} ckpt=RUN ...")
    probe = sys.argv.pop(1)
    PROBES[probe]()


if __name__ == "__main__":
    main()
