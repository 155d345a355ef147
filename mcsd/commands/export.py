"""mcsd-export: a trained model as a Hugging Face ``transformers`` folder (and Hub repository).

    mcsd-export ckpt=logs/train/runs/<run> out=exported/my-model
    mcsd-export ckpt=... out=... push_to_hub=user/my-model
    mcsd-export ckpt=... out=exported/my-model-onnx format=onnx    # ONNX graphs (mcsd.deploy.onnx)

The folder holds ``config.json`` (``model_type`` mcsd, an ``auto_map`` to ``modeling_mcsd.py``,
which imports the installed mcsd package), ``model.safetensors``, ``generation_config.json``,
the tokenizer (``tokenizer.json``, ``tokenizer_config.json``) and a model card (``README.md``).
It is written beside ``out`` first and moved into place whole, so a failure leaves nothing.
``overwrite=true`` replaces only an earlier export (a folder holding nothing but what an export
writes), never another folder, nor one that holds the model being exported.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from tokenizers import Tokenizer

from mcsd.checkpoint.lightning_checkpoint import read_checkpoint
from mcsd.checkpoint.resume import OVERRIDES_KEY, WANDB_RUN_KEY
from mcsd.checkpoint.run_folder import RunFolder
from mcsd.checkpoint.saved_model import SavedModel, load, load_tokenizer, locate, trained_seq_len
from mcsd.commands.app import hydra_app, refuse_onnx_export
from mcsd.data.tokenizer import EOS_TOKEN
from mcsd.deploy.onnx import check_onnx_installed, check_onnx_weights, write_onnx_export
from mcsd.deploy.onnx_runner import MANIFEST_FILE, TOKENIZER_FILE as ONNX_TOKENIZER_FILE
from mcsd.runtime import git_commit
from mcsd.errors import MCSDError
from mcsd.files import give_default_permissions
from mcsd.hf import as_hf_model, as_hf_tokenizer
from mcsd.hf.configuration import REMOTE_CODE_FILE
from mcsd.models import CausalLM, registry

# What an export writes (``save_pretrained`` of a model and a tokenizer, our files): a folder holding
# anything else is not an earlier export, and overwrite=true leaves it alone.
EXPORT_FILE = re.compile(r"(config|generation_config|tokenizer|tokenizer_config|special_tokens_map|added_tokens"
                         r"|vocab|model\.safetensors\.index)\.json|model(-\d+-of-\d+)?\.safetensors|merges\.txt"
                         r"|chat_template\.jinja|README\.md|" + re.escape(REMOTE_CODE_FILE))
# What an ONNX export writes (mcsd.deploy.onnx), and the file that marks a folder as one.
ONNX_EXPORT_FILE = re.compile(r"(prefill|step)\.onnx|export\.json|tokenizer\.json|README\.md")
ONNX_MARKER = MANIFEST_FILE
FORMATS = ("hf", "onnx")
# Each format's files and the file that marks a folder as its export.
EXPORTS = {"hf": (EXPORT_FILE, REMOTE_CODE_FILE, "transformers"), "onnx": (ONNX_EXPORT_FILE, ONNX_MARKER, "ONNX")}
WORK_PREFIX = "."  # an export is written in .<out>.XXXX/ beside out (new/, and earlier/ while they swap)
DEFAULT_ONNX_CAPACITY = 2048  # a model whose run recorded no sequence length


def write_export(model: CausalLM, tokenizer: Tokenizer, folder: Path, card: str) -> Path:
    """Write ``model`` and ``tokenizer`` as a ``from_pretrained`` folder, with the model card ``card``."""
    hf_tokenizer = as_hf_tokenizer(tokenizer)
    hf_model = as_hf_model(model, hf_tokenizer.eos_token_id)
    hf_model.save_pretrained(folder)  # with modeling_mcsd.py, as every save of the config
    hf_tokenizer.save_pretrained(folder)
    (folder / "README.md").write_text(card)
    return folder


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_out(setting: str, out: Path, saved: SavedModel, overwrite: bool, format: str = "hf") -> None:
    """Refuse, before anything is written, an ``out`` that exporting would harm: one that holds
    (or is) the model being exported or its run, a file, and a folder that is not empty, unless
    it is an earlier export of either format (only what one writes, with its marker file) and
    ``overwrite`` is true. ``out`` is resolved; ``setting`` is what the user typed."""
    source = saved.path.resolve()
    run = saved.run_directory
    for held in (source, *([run.resolve()] if run is not None else [])):
        if _within(held, out):
            raise MCSDError(f"out={setting} holds the model being exported ({held}): choose a folder outside it")
    if not out.exists():
        return
    if not out.is_dir():
        raise MCSDError(f"out={setting} is a file: choose a folder (a new one, or an earlier export with overwrite=true)")
    entries = sorted(out.iterdir())
    if not entries:
        return
    earlier = next((name for name, (pattern, marker, _) in EXPORTS.items() if (out / marker).is_file()
                    and all(entry.is_file() and pattern.fullmatch(entry.name) for entry in entries)), None)
    if earlier is None:
        pattern, marker, _ = EXPORTS[format]
        foreign = [entry.name + ("/" if entry.is_dir() else "") for entry in entries
                   if entry.is_dir() or not pattern.fullmatch(entry.name)]
        named = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        why = f"holds what an export does not write ({named})" if foreign else f"is not an earlier export (no {marker})"
        raise MCSDError(f"out={setting} {why}: choose a new or empty folder (overwrite=true replaces only an earlier "
                        "export)")
    if not overwrite:
        raise MCSDError(f"out={setting} exists (an earlier {EXPORTS[earlier][2]} export): choose a new folder, or "
                        "overwrite=true to replace it")


def recover_interrupted_export(out: Path) -> None:
    """An export killed outright (SIGKILL) leaves its working folder beside ``out``: its new
    export half written, and, killed between the two renames, the earlier export moved out of
    ``out``'s place. The earlier export goes back to ``out``; the rest of such a folder is removed.
    A folder whose export is still running (its process alive) is left alone."""
    for work in out.parent.glob(f"{WORK_PREFIX}{out.name}.*"):
        if not work.is_dir() or not {entry.name for entry in work.iterdir()} <= {"new", "earlier", "pid"}:
            continue
        pid = (work / "pid").read_text().strip() if (work / "pid").is_file() else ""
        if pid.isdigit() and _alive(int(pid)):
            continue
        if (work / "earlier").is_dir() and not out.exists():
            (work / "earlier").rename(out)
        shutil.rmtree(work, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _last_value(rows: list[dict[str, str]], key: str) -> float | None:
    values = [float(row[key]) for row in rows if row.get(key) not in (None, "")]
    return values[-1] if values else None


def describe_training(saved: SavedModel) -> dict[str, Any]:
    """What the model card says of the training run: tokens, data, final validation perplexity,
    the command's overrides and the W&B run (each ``None`` where the run left no record)."""
    run_path = saved.run_directory
    run = RunFolder(run_path) if run_path is not None else None
    latest = run.latest_checkpoint() if run is not None and saved.kind != "checkpoint" else None
    checkpoint = (saved.checkpoint() if saved.kind == "checkpoint"  # the export's own, read once for all
                  else read_checkpoint(latest) if latest is not None and latest.exists() else {})
    facts: dict[str, Any] = {"overrides": checkpoint.get(OVERRIDES_KEY), "wandb_run": checkpoint.get(WANDB_RUN_KEY),
                             "tokens": None, "val_ppl": None, "data": None}
    tokens_seen = checkpoint.get("state_dict", {}).get("tokens_seen")
    if isinstance(tokens_seen, torch.Tensor):
        facts["tokens"] = int(tokens_seen)
    if run is None:
        return facts
    if run.overrides() is not None:
        facts["overrides"] = run.overrides()
    config, choices = run.config(), run.choices()
    if config is not None and choices is not None:
        data = config.get("data") or {}
        source = data.get("hub_path") or data.get("paths")
        facts["data"] = f"`data={choices.get('data')}`" + (f" ({source})" if source else "")
    rows = run.metrics()
    if rows and saved.kind == "folder":  # the final model: the run's last records
        facts["val_ppl"] = _last_value(rows, "val/ppl")
        tokens = _last_value(rows, "trainer/tokens")
        facts["tokens"] = int(tokens) if tokens is not None else facts["tokens"]
    return facts


def model_card(model: CausalLM, saved: SavedModel, facts: dict[str, Any]) -> str:
    """The model card (README.md): what the model is, how it was trained, how to use it."""
    architecture = registry.of_config(model.config)
    variant = architecture.variant_of(model.config.to_dict())
    params = sum(parameter.numel() for parameter in model.parameters())

    def known(value: Any, form: str = "{}") -> str:
        return "not recorded" if value is None or (isinstance(value, float) and math.isnan(value)) else form.format(value)

    command = "mcsd-train " + " ".join(facts["overrides"]) if facts["overrides"] is not None else None
    rows = [("architecture", f"{architecture.label} (`{architecture.name}`), variant `{variant}`"),
            ("parameters", f"{params:,}"),
            ("training tokens", known(facts["tokens"], "{:,}")),
            ("data", known(facts["data"])),
            ("final validation perplexity", known(facts["val_ppl"], "{:.2f}")),
            ("command", known(command, "`{}`")),
            ("W&B run", known(facts["wandb_run"], "`{}`")),
            ("exported from", f"`{saved.name}` (mcsd commit `{git_commit()}`)")]
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    tags = "\n".join(f"- {tag}" for tag in dict.fromkeys(["mcsd", architecture.name]))
    return f"""---
library_name: transformers
tags:
{tags}
- text-generation
---

# {architecture.label} language model ({variant})

Trained and exported with the mcsd research harness
(`mcsd-export`). The model class lives in the `mcsd` package: install it, then load with
`trust_remote_code=True` (the folder's `modeling_mcsd.py` only imports it).

| | |
|---|---|
{table}

## Use

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained(PATH_OR_REPO, trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained(PATH_OR_REPO)
ids = tokenizer("The ", return_tensors="pt").input_ids
print(tokenizer.decode(model.generate(ids, max_new_tokens=50, do_sample=False)[0]))
```

```bash
lm_eval --model hf --model_args pretrained=PATH_OR_REPO,trust_remote_code=True --tasks arc_easy
```

A batch padded on either side runs in one pass, each row exactly as it runs alone (forward and
`generate`: greedy, sampling, beam search). `save_pretrained` and `Trainer.save_model` write a
folder that loads the same way.
"""


def push(folder: Path, repo_id: str, private: bool) -> str:
    """Upload ``folder`` to the Hub repository ``repo_id`` (created if needed); return its URL."""
    from huggingface_hub import HfApi

    from mcsd.data.corpus import hub_is_reachable

    later = f"the export is in {folder}; upload it later with `hf upload {repo_id} {folder}`"
    if not hub_is_reachable():
        raise MCSDError(f"push_to_hub={repo_id}: the Hugging Face Hub is unreachable from here: {later}")
    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message="Upload a model exported by mcsd")
    except Exception as error:  # huggingface_hub raises HTTP, auth and network errors of many types
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise MCSDError(f"push_to_hub={repo_id}: {reason}: {later}") from None
    return f"https://huggingface.co/{repo_id}"


def onnx_card(saved: SavedModel, manifest: dict[str, Any]) -> str:
    """The README.md of an ONNX export: what it holds and how to run it."""
    return f"""# {manifest['architecture']} decoding, exported to ONNX by mcsd

From `{saved.name}` (mcsd commit `{git_commit()}`, torch {manifest['torch']}, weights in {manifest['dtype']}{
    "" if manifest['weights'] == "full" else f"; linear weights {manifest['weights']}, ONNX Runtime's MatMulNBits"}).

- `prefill.onnx`: `input_ids` [batch, length] (int64, 1 to {manifest['capacity'] - 1} tokens) -> `logits` [batch, vocab]
  of the last position and the state after the prompt (`state.0` ..).
- `step.onnx`: `token_ids` [batch], `position` (int64, tokens seen so far), the state -> `logits` and
  the state after the token (`new_state.0` ..).{" KV caches hold " + str(manifest['capacity']) + " positions; for each the step returns the token's entries alone, [batch, heads, 1, ..], to be written at `position` in place (`step_output` in export.json)." if manifest['has_kv_cache'] else ""}
- `export.json`: the state's names and dtypes, the capacity, the end-of-text token; `tokenizer.json`.

Run it with ONNX Runtime, NumPy and tokenizers alone (mcsd's runner, `mcsd/deploy/onnx_runner.py`,
imports neither torch nor the rest of mcsd):

```bash
mcsd-generate ckpt=THIS_FOLDER runtime=onnx prompt="The "
```
"""


def export(cfg: DictConfig) -> Path:
    """Export ``cfg.ckpt`` to ``cfg.out`` (and push it to ``cfg.push_to_hub``); return the folder.
    ``format=onnx``: the decoding graphs and the tokenizer (:mod:`mcsd.deploy.onnx`) instead."""
    export_format = cfg.get("format", "hf")
    if export_format not in FORMATS:
        raise MCSDError(f"format={export_format!r} is not an export format: use hf (a transformers folder) or onnx")
    weights = cfg.get("weights", "full")
    if weights != "full" and export_format != "onnx":
        raise MCSDError(f"weights={weights} quantizes an ONNX export (format=onnx); a transformers folder holds full "
                        "weights (quantize when loading: mcsd.quantize_weights)")
    if export_format == "onnx":
        check_onnx_installed()
        check_onnx_weights(weights)
        if cfg.push_to_hub:
            raise MCSDError("push_to_hub uploads a transformers folder: export with format=hf to push, or leave "
                            "push_to_hub=null for format=onnx")
    if cfg.push_to_hub:
        from huggingface_hub import get_token

        if get_token() is None:
            raise MCSDError(f"push_to_hub={cfg.push_to_hub} needs a Hugging Face token: run `hf auth login` "
                            "(or set HF_TOKEN), or export without push_to_hub")
    refuse_onnx_export("mcsd-export", cfg.ckpt, "give the model folder or run it was exported from")
    saved = locate(cfg.ckpt)
    out = Path(cfg.out).expanduser().resolve()
    if out.parent.is_dir():
        recover_interrupted_export(out)
    check_out(str(cfg.out), out, saved, cfg.overwrite, export_format)
    capacity = onnx_capacity(cfg, saved) if export_format == "onnx" else None
    model, tokenizer = load(saved), load_tokenizer(saved)  # the saved model read once for both
    # A folder of our own beside out (a fresh name: nothing there but what this export puts in it) holds
    # the new export while it is written and the earlier one while the new one moves into place.
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{out.name}.", dir=out.parent))
    staging, earlier = work / "new", work / "earlier"
    try:
        (work / "pid").write_text(f"{os.getpid()}\n")  # an export killed outright: recover_interrupted_export
        staging.mkdir()
        if export_format == "onnx":
            manifest = write_onnx_export(model, staging, capacity, tokenizer.token_to_id(EOS_TOKEN), saved.name,
                                         weights)
            tokenizer.save(str(staging / ONNX_TOKENIZER_FILE))
            (staging / "README.md").write_text(onnx_card(saved, manifest))
        else:
            write_export(model, tokenizer, staging, model_card(model, saved, describe_training(saved)))
        give_default_permissions(staging)  # the weights are written 0600
        if out.is_dir():  # an earlier export (check_out)
            out.rename(earlier)
        try:
            staging.rename(out)
        except BaseException:
            if earlier.is_dir():
                earlier.rename(out)  # the earlier export back in its place
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if export_format == "onnx":
        print(f"exported {saved.name} to {out} (ONNX, KV caches of {capacity} positions where the model has them): "
              f"mcsd-generate ckpt={out} runtime=onnx", flush=True)
        return out
    print(f"exported {saved.name} to {out}: AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)",
          flush=True)
    if cfg.push_to_hub:
        print(f"pushed to {push(out, cfg.push_to_hub, cfg.private)}", flush=True)
    return out


def onnx_capacity(cfg: DictConfig, saved: SavedModel) -> int:
    """The positions an ONNX export's KV caches hold: ``capacity``, or the trained sequence length."""
    capacity = cfg.get("capacity")
    if capacity is None:
        capacity = trained_seq_len(saved) or DEFAULT_ONNX_CAPACITY
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 2:
        raise MCSDError(f"capacity={capacity} must be a whole number of positions, at least 2 (a prompt and a new token)")
    return capacity


@hydra_app("mcsd-export", "export")
def main(cfg: DictConfig) -> None:
    """Entry point of ``mcsd-export``."""
    export(cfg)


if __name__ == "__main__":
    main()
