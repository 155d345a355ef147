"""Decoding with an ONNX export (:mod:`mcsd.deploy.onnx`) through ONNX Runtime, with NumPy alone:
this module imports neither torch nor the rest of mcsd, so the folder and this file run on a
device that has only ``onnxruntime``, ``numpy`` and ``tokenizers``.

    decoder = OnnxDecoder("exported/my-model-onnx")
    text = decoder.generate_text("The ", max_new_tokens=50)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

MANIFEST_FILE, PREFILL_FILE, STEP_FILE, TOKENIZER_FILE = "export.json", "prefill.onnx", "step.onnx", "tokenizer.json"


def is_onnx_export(folder: str | Path) -> bool:
    """Whether ``folder`` holds an ONNX export (its manifest and step graph)."""
    return (Path(folder) / MANIFEST_FILE).is_file() and (Path(folder) / STEP_FILE).is_file()


class OnnxExportError(ValueError):
    """A folder that is not an ONNX export, a runtime that is missing, a sequence past the capacity."""


class OnnxDecoder:
    """The prefill and the step of an exported model as ONNX Runtime sessions: ``prefill(ids)``
    -> (logits ``[B, vocab]``, state), ``step(tokens, state)`` -> (logits, state), where a state
    is the position and the list of the graph's state arrays. A step writes its token's KV-cache
    entries into the state's caches in place (as PyTorch's decoding advances its state): a state
    that is to be continued twice is copied first."""

    def __init__(self, folder: str | Path, threads: int | None = None) -> None:
        try:
            import onnxruntime
        except ImportError:
            raise OnnxExportError("runtime=onnx needs onnxruntime, which is not installed: pip install onnxruntime "
                                  "(or pip install 'mcsd[edge]')") from None
        self.folder = Path(folder)
        manifest = self.folder / MANIFEST_FILE
        missing = [name for name in (MANIFEST_FILE, PREFILL_FILE, STEP_FILE) if not (self.folder / name).is_file()]
        if missing:
            raise OnnxExportError(f"{self.folder} is not an ONNX export of mcsd (no {', '.join(missing)}): export one "
                                  "with mcsd-export format=onnx")
        try:
            self.manifest = json.loads(manifest.read_text())
            self.capacity = int(self.manifest["capacity"])
            self.state_names = [entry["name"] for entry in self.manifest["state"]]
            # Format 2: a KV cache's step output is the token's entries, written here at the position;
            # format 1's step returned every state whole.
            self.writes_entries = [entry.get("step_output") == "entries" for entry in self.manifest["state"]]
        except (ValueError, KeyError, TypeError) as error:
            raise OnnxExportError(f"{manifest} is not a readable export manifest ({type(error).__name__}: {error}; "
                                  "truncated or corrupt): export the model again with mcsd-export format=onnx") from None
        options = onnxruntime.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        self.prefill_session, self.step_session = (self._session(onnxruntime, name, options)
                                                   for name in (PREFILL_FILE, STEP_FILE))
        self._check_graphs()

    def _session(self, onnxruntime, name: str, options) -> onnxruntime.InferenceSession:
        """ONNX Runtime's session of the graph ``name``; a file it cannot read is one line."""
        try:
            return onnxruntime.InferenceSession(str(self.folder / name), options, providers=["CPUExecutionProvider"])
        except Exception as error:  # noqa: BLE001  ONNX Runtime raises its own pybind errors (InvalidProtobuf, Fail, ...)
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise OnnxExportError(f"{self.folder / name} is not a readable ONNX graph ({reason}): export the model "
                                  "again with mcsd-export format=onnx") from None

    def _check_graphs(self) -> None:
        """The prefill, the step and the manifest are one export's: the step reads the states the
        manifest names and the prefill writes, of the same fixed sizes, and both give logits over
        one vocabulary (a graph copied from another export fails here, not after its first token)."""
        prefill_outputs, step_inputs = self.prefill_session.get_outputs(), self.step_session.get_inputs()
        expected = ["token_ids", "position", *self.state_names]
        problem = None
        if sorted(item.name for item in step_inputs) != sorted(expected):
            problem = f"the step reads {', '.join(item.name for item in step_inputs)}, the manifest names {', '.join(expected)}"
        elif len(prefill_outputs) != 1 + len(self.state_names):
            problem = f"the prefill writes {len(prefill_outputs) - 1} states, the manifest names {len(self.state_names)}"
        else:
            shapes = {item.name: item.shape for item in step_inputs}
            pairs = [(prefill_outputs[0].shape, self.step_session.get_outputs()[0].shape, "logits")] + [
                (written.shape, shapes[name], name) for written, name in zip(prefill_outputs[1:], self.state_names)]
            for first, second, name in pairs:
                fixed = [(a, b) for a, b in zip(first, second) if isinstance(a, int) and isinstance(b, int)]
                if len(first) != len(second) or any(a != b for a, b in fixed):
                    problem = f"{name} is {list(first)} in the prefill and {list(second)} in the step"
                    break
        if problem is not None:
            raise OnnxExportError(f"{self.folder}: {PREFILL_FILE} and {STEP_FILE} are not the graphs of one export "
                                  f"({problem}): export the model again with mcsd-export format=onnx")

    def check_room(self, end: int) -> None:
        """Refuse a sequence of ``end`` tokens past the KV caches' capacity, in one line."""
        if self.manifest["has_kv_cache"] and end > self.capacity:
            raise OnnxExportError(f"the sequence reaches {end} tokens, past the {self.capacity} positions this export's KV "
                                  "caches hold: export again with a larger capacity (mcsd-export format=onnx capacity=...)")

    def prefill(self, input_ids: np.ndarray) -> tuple[np.ndarray, tuple[int, list[np.ndarray]]]:
        """The prompt ``input_ids`` ``[B, N]``: the last position's logits and the state after it."""
        input_ids = np.asarray(input_ids, dtype=np.int64)
        self.check_room(input_ids.shape[1])
        logits, *state = self.prefill_session.run(None, {"input_ids": input_ids})
        state = [np.require(array, requirements=["C", "W"]) for array in state]  # written in place by steps
        return logits, (input_ids.shape[1], state)

    def step(self, token_ids: np.ndarray, state: tuple[int, list[np.ndarray]]) -> tuple[np.ndarray, tuple[int, list[np.ndarray]]]:
        """One token per row, ``token_ids`` ``[B]``: its logits and the state after it."""
        position, arrays = state
        self.check_room(position + 1)
        feeds = {"token_ids": np.asarray(token_ids, dtype=np.int64), "position": np.asarray(position, dtype=np.int64),
                 **dict(zip(self.state_names, arrays))}
        logits, *outputs = self.step_session.run(None, feeds)
        for array, output, entries in zip(arrays, outputs, self.writes_entries):
            if entries:
                array[:, :, position] = output[:, :, 0]
        return logits, (position + 1, [array if entries else output
                                       for array, output, entries in zip(arrays, outputs, self.writes_entries)])

    def stream(self, input_ids: np.ndarray, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
               top_p: float | None = None, eos_token_id: int | None = None, seed: int = 0) -> Iterator[np.ndarray]:
        """Yield the next token of every row ``[B]``, ``max_new_tokens`` times (or until every row
        has ended with ``eos_token_id``; a row that has keeps yielding it): greedy at temperature 0,
        else sampled."""
        rng = np.random.default_rng(seed)
        logits, state = self.prefill(input_ids)
        ended = np.zeros(logits.shape[0], dtype=bool)
        for index in range(max_new_tokens):
            tokens = next_tokens(logits, temperature, top_k, top_p, rng)
            if eos_token_id is not None:
                tokens = np.where(ended, eos_token_id, tokens)
                ended |= tokens == eos_token_id
            yield tokens
            if ended.all():
                return
            if index + 1 < max_new_tokens:
                logits, state = self.step(tokens, state)

    def tokenizer(self) -> Tokenizer:
        """The export's tokenizer (``tokenizer.json``)."""
        from tokenizers import Tokenizer

        path = self.folder / TOKENIZER_FILE
        if not path.is_file():
            raise OnnxExportError(f"{self.folder} has no {TOKENIZER_FILE}: export the model again with mcsd-export "
                                  "format=onnx (an export ships its tokenizer)")
        try:
            return Tokenizer.from_file(str(path))
        except Exception as error:  # noqa: BLE001  tokenizers raises a bare Exception for a file it cannot parse
            raise OnnxExportError(f"{path} is not a readable tokenizer ({error}): export the model again") from None

    def generate_text(self, prompt: str, max_new_tokens: int, **sampling) -> str:
        """``prompt`` and its continuation, decoded by the export's tokenizer."""
        tokenizer = self.tokenizer()
        ids = np.array([tokenizer.encode(prompt).ids], dtype=np.int64)
        new = [int(tokens[0]) for tokens in self.stream(ids, max_new_tokens,
                                                        eos_token_id=self.manifest.get("eos_token_id"), **sampling)]
        eos = self.manifest.get("eos_token_id")
        if eos is not None and eos in new:
            new = new[:new.index(eos)]
        return prompt + tokenizer.decode(new)


def next_tokens(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
                rng: np.random.Generator) -> np.ndarray:
    """The next token of each row of ``logits`` ``[B, vocab]``: the argmax at temperature 0; else
    sampled at ``temperature`` from the ``top_k`` most likely and the smallest set whose
    probability reaches ``top_p`` (each optional), as :func:`mcsd.models.decoding.sample_next_token`."""
    if temperature == 0:
        return logits.argmax(-1)
    scores = logits.astype(np.float64) / temperature
    if top_k is not None and top_k < scores.shape[-1]:
        kth = np.sort(scores, axis=-1)[:, -top_k][:, None]
        scores = np.where(scores < kth, -np.inf, scores)
    probabilities = np.exp(scores - scores.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    if top_p is not None:
        order = np.argsort(-probabilities, axis=-1)
        ranked = np.take_along_axis(probabilities, order, -1)
        outside = np.cumsum(ranked, -1) - ranked > top_p  # after the smallest set reaching top_p
        kept = np.zeros_like(probabilities)
        np.put_along_axis(kept, order, np.where(outside, 0.0, ranked), -1)
        probabilities = kept / kept.sum(-1, keepdims=True)
    return np.array([rng.choice(len(row), p=row) for row in probabilities])
