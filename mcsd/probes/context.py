"""The long-context probe: does a model use what lies more than N tokens back?

For documents of ``length`` tokens (at least 4x the training length), three losses of the
token after position ``t`` are compared, paired per document and position:

- *full*: the model reads the whole past, tokens ``0 .. t`` (one pass per document);
- *last N*: it reads only tokens ``t-N+1 .. t``, as a fresh sequence;
- *swapped* (the control): it reads another document's tokens ``0 .. t-N``, then this
  document's ``t-N+1 .. t``: the same length and positions as the full past, with the
  distant past's content replaced.

``Delta_N`` = mean of (last N - full) over evaluation positions ``t >= max(windows)``: the
context beyond N is used iff ``Delta_N > 0``. The swapped control separates a change of
content from a change of length (a model whose loss moves with its position alone, as a
Transformer read past its training length, shows ``Delta_N != 0`` with a swapped ``~0``).
Intervals are percentile bootstraps over documents, resampling each document's mean
difference (the pairing is kept). The long passes go through the architecture's ``form``
(its chunkwise form by default: linear time for the recurrent models); the swapped
control continues the other document's decoding state, so its prefix is read once.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from mcsd.errors import MCSDError
from mcsd.models import CausalLM


@dataclass
class ContextProbe:
    """The probe's results: the loss by position (log-spaced bins) and ``Delta_N`` per window."""

    curve: pd.DataFrame  # bin_start, bin_end, loss, loss_low, loss_high
    deltas: pd.DataFrame  # window, delta, delta_low, delta_high, swapped, swapped_low, swapped_high, ...


def evaluation_positions(length: int, windows: list[int], count: int) -> list[int]:
    """``count`` positions evenly spread over ``[max(windows), length - 2]`` (each predicts the
    token after it, inside the document)."""
    first, last = max(windows), length - 2
    if first > last:
        raise MCSDError(f"length={length} leaves no position beyond the longest window {max(windows)}: "
                        "raise length or drop the longest window")
    return sorted({int(round(p)) for p in np.linspace(first, last, count)})


def _token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")


@torch.no_grad()
def _losses(model: CausalLM, documents: torch.Tensor, others: torch.Tensor, windows: list[int],
            positions: list[int], form: str, max_tokens: int, progress: tqdm) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss of the full past ``[B, length - 1]``, and ``[B, windows, positions]`` losses
    with the last N tokens (``last``) and with the distant past swapped (``swapped``)."""
    full = _token_nll(model(documents[:, :-1], form=form), documents[:, 1:])
    progress.update(documents[:, :-1].numel())
    batch = documents.shape[0]
    last = torch.empty(batch, len(windows), len(positions))
    swapped = torch.empty_like(last)
    for w, window in enumerate(windows):
        # Every position's last-N window as a row (rows [position][document]), max_tokens a call.
        rows = torch.cat([documents[:, t - window + 1:t + 1] for t in positions])
        targets = torch.cat([documents[:, t + 1] for t in positions])
        per_call = max(1, max_tokens // window)
        nll = [F.cross_entropy(model.prefill(rows[r:r + per_call], form=form)[0].float(), targets[r:r + per_call],
                               reduction="none") for r in range(0, len(rows), per_call)]
        last[:, w] = torch.cat(nll).view(len(positions), batch).T
        progress.update(len(rows) * window)
    # The swapped control: read the other documents once, splicing in at every start.
    splices = sorted({(t - window + 1, w, p) for w, window in enumerate(windows) for p, t in enumerate(positions)})
    state, read = None, 0
    for start, w, p in splices:
        if start > read:
            _, state = model.prefill(others[:, read:start], state, form=form)
            read = start
        t = positions[p]
        logits, _ = model.prefill(documents[:, start:t + 1], copy.deepcopy(state), form=form)
        swapped[:, w, p] = F.cross_entropy(logits.float(), documents[:, t + 1], reduction="none")
    progress.update(_swapped_tokens(batch, windows, positions))
    return full, {"last": last, "swapped": swapped}


def _swapped_tokens(batch: int, windows: list[int], positions: list[int]) -> int:
    """The tokens the swapped control reads for ``batch`` documents: the other documents up to the
    last splice, then each window's own tokens."""
    starts = {t - window + 1 for window in windows for t in positions}
    return batch * (max(starts) + sum(window for window in windows for _ in positions))


def _probe_tokens(batch: int, length: int, windows: list[int], positions: list[int]) -> int:
    """The tokens the probe reads for ``batch`` documents (what its progress bar counts): the full
    past, every position's last-N window, the swapped control."""
    return batch * (length - 1 + len(positions) * sum(windows)) + _swapped_tokens(batch, windows, positions)


def _bootstrap(per_document: np.ndarray, draws: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """Mean over documents and its 95% percentile-bootstrap interval (resampling documents)."""
    mean = float(per_document.mean())
    if len(per_document) < 2 or draws < 1:
        return mean, mean, mean
    samples = per_document[rng.integers(0, len(per_document), size=(draws, len(per_document)))].mean(axis=1)
    low, high = np.percentile(samples, [2.5, 97.5])
    return mean, float(low), float(high)


@dataclass
class ContextLosses:
    """The probe's losses of the documents read so far, per document in order: the full past's
    per-token losses ``full`` ``[D, length - 1]``, and ``last`` and ``swapped`` ``[D, windows,
    positions]`` (what :func:`_losses` gives a batch). The part of a probe that resumes."""

    full: torch.Tensor
    last: torch.Tensor
    swapped: torch.Tensor

    @property
    def documents(self) -> int:
        return len(self.full)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The losses by name, as :mod:`mcsd.checkpoint.probe_results` keeps them."""
        return {"full": self.full, "last": self.last, "swapped": self.swapped}

    def then(self, more: ContextLosses) -> ContextLosses:
        """These documents' losses followed by ``more``'s."""
        return ContextLosses(*(torch.cat([mine, theirs]) for mine, theirs in
                               zip((self.full, self.last, self.swapped), (more.full, more.last, more.swapped))))


class ContextProbePlan:
    """The probe of ``documents`` ``[D, length]`` (token ids; D >= 2, each document's swap partner
    is the previous one, cyclically) in batches of ``batch_size`` documents (:meth:`batches`,
    each read by :meth:`losses`), at most ``max_tokens`` tokens in one call of the model for the
    last-N windows, and what its losses give (:meth:`summary`)."""

    def __init__(self, model: CausalLM, documents: torch.Tensor, windows: list[int], num_positions: int = 16,
                 batch_size: int = 4, form: str | None = None, max_tokens: int = 16384) -> None:
        if documents.dim() != 2 or documents.shape[0] < 2:
            raise MCSDError(f"the probe needs at least 2 documents of equal length (got shape "
                            f"{tuple(documents.shape)}): give more or longer documents")
        self.model, self.documents, self.windows = model, documents, sorted(windows)
        self.length = documents.shape[1]
        self.positions = evaluation_positions(self.length, self.windows, num_positions)
        self.batch_size, self.max_tokens = batch_size, max_tokens
        self.form = form or model.default_form
        self.others = documents.roll(1, dims=0)

    def batches(self, first: int = 0) -> list[int]:
        """The first document of each batch, from document ``first`` on (those before it read)."""
        return list(range(first, len(self.documents), self.batch_size))

    def read_tokens(self, documents: int) -> int:
        """The tokens the probe of ``documents`` documents feeds the model."""
        return _probe_tokens(documents, self.length, self.windows, self.positions)

    def tokens(self, start: int) -> int:
        """The tokens the batch from document ``start`` feeds the model."""
        return self.read_tokens(len(self.documents[start:start + self.batch_size]))

    def losses(self, start: int, progress: tqdm) -> ContextLosses:
        """The losses of the batch from document ``start`` (``progress`` moves by its tokens), on
        the CPU whatever the model's device: what the summary reads with NumPy and a resumed
        probe's earlier losses (read from their file) are joined to."""
        end = start + self.batch_size
        full, windowed = _losses(self.model, self.documents[start:end], self.others[start:end], self.windows,
                                 self.positions, self.form, self.max_tokens, progress)
        return ContextLosses(full.cpu(), windowed["last"].cpu(), windowed["swapped"].cpu())

    def summary(self, losses: ContextLosses, bootstrap: int = 1000, seed: int = 0) -> ContextProbe:
        """The loss by position and ``Delta_N`` of the documents ``losses`` holds (the first ones,
        where a probe stopped early), with ``bootstrap`` draws for the intervals."""
        full, last, swapped = losses.full.numpy(), losses.last.numpy(), losses.swapped.numpy()
        rng = np.random.default_rng(seed)
        length, positions = self.length, self.positions
        edges = sorted({0, *(2**k for k in range(int(np.log2(length)) + 1) if 2**k < length - 1), length - 1})
        curve = []
        for low, high in zip(edges[:-1], edges[1:]):
            loss, loss_low, loss_high = _bootstrap(full[:, low:high].mean(axis=1), bootstrap, rng)
            curve.append({"bin_start": low, "bin_end": high, "loss": loss, "loss_low": loss_low,
                          "loss_high": loss_high})
        at_positions = full[:, positions]
        deltas = []
        for w, window in enumerate(self.windows):
            delta = _bootstrap((last[:, w] - at_positions).mean(axis=1), bootstrap, rng)
            control = _bootstrap((swapped[:, w] - at_positions).mean(axis=1), bootstrap, rng)
            deltas.append({"window": window, "delta": delta[0], "delta_low": delta[1], "delta_high": delta[2],
                           "swapped": control[0], "swapped_low": control[1], "swapped_high": control[2],
                           "loss_full": float(at_positions.mean()), "loss_last": float(last[:, w].mean()),
                           "documents": len(full), "documents_planned": len(self.documents),
                           "positions": len(positions), "first_position": positions[0]})
        return ContextProbe(curve=pd.DataFrame(curve), deltas=pd.DataFrame(deltas))


def probe_context(model: CausalLM, documents: torch.Tensor, windows: list[int], num_positions: int = 16,
                  batch_size: int = 4, form: str | None = None, bootstrap: int = 1000, seed: int = 0,
                  max_tokens: int = 16384) -> ContextProbe:
    """The probe of ``documents`` ``[D, length]`` (:class:`ContextProbePlan`), every batch read
    under one progress bar of the tokens the model reads. ``mcsd-probe context`` runs the same
    batches as jobs that Ctrl-C stops and ``resume=true`` goes on with."""
    plan = ContextProbePlan(model, documents, windows, num_positions, batch_size, form, max_tokens)
    with tqdm(total=sum(plan.tokens(start) for start in plan.batches()), desc="context probe", unit="token",
              unit_scale=True) as progress:
        parts = [plan.losses(start, progress) for start in plan.batches()]
    losses = parts[0]
    for part in parts[1:]:
        losses = losses.then(part)
    return plan.summary(losses, bootstrap, seed)
