"""An lm-evaluation-harness model (registered as ``mcsd``) around a saved mcsd model.

    lm_eval --model mcsd --model_args pretrained=RUN_OR_MODEL_DIR --tasks arc_easy
Scoring (``loglikelihood``, ``loglikelihood_rolling``) runs batches through the form the
architecture trains with; ``generate_until`` decodes through its recurrent state or KV
cache and stops at the first stop string.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

import mcsd
from mcsd.data.tokenizer import eos_id


@register_model("mcsd")
class MCSDEvalModel(TemplateLM):
    """Any model that ``mcsd.load`` reads (a model folder, a run directory or a ``.ckpt``), of
    any registered architecture, for lm-eval."""

    def __init__(
        self,
        pretrained: str,
        batch_size: int | str = 8,
        device: str = "cpu",
        max_length: int = 2048,
        max_gen_toks: int = 256,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.model = mcsd.load(pretrained, device=device)
        self.tokenizer = mcsd.load_tokenizer(pretrained)
        self._device = torch.device(device)
        self.batch_size = int(batch_size) if str(batch_size) != "auto" else 8
        self.max_length = int(max_length)
        self.max_gen_toks = int(max_gen_toks)
        self._eot = eos_id(self.tokenizer)

    @property
    def eot_token_id(self) -> int:
        return self._eot

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.tokenizer.encode(string).ids

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    @torch.inference_mode()
    def score(self, inputs: list[list[int]], targets: list[list[int]]) -> list[tuple[float, bool]]:
        """Sum of log-probabilities of each ``targets[i]`` right after ``inputs[i]``, and whether
        greedy decoding would have produced it. Rows are padded on the right (the model is
        causal, so padding never changes a scored position)."""
        results = []
        for start in range(0, len(inputs), self.batch_size):
            batch_inputs, batch_targets = inputs[start : start + self.batch_size], targets[start : start + self.batch_size]
            width = max(len(row) for row in batch_inputs)
            ids = torch.full((len(batch_inputs), width), self._eot, dtype=torch.long)
            for row, tokens in enumerate(batch_inputs):
                ids[row, : len(tokens)] = torch.tensor(tokens)
            log_probs = F.log_softmax(self.model(ids.to(self._device)).float(), dim=-1)
            for row, (tokens, target) in enumerate(zip(batch_inputs, batch_targets)):
                positions = torch.arange(len(tokens) - len(target), len(tokens))
                predicted = log_probs[row, positions]
                wanted = torch.tensor(target, device=predicted.device)
                total = float(predicted.gather(-1, wanted[:, None]).sum())
                results.append((total, bool((predicted.argmax(-1) == wanted).all())))
        return results

    def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        inputs, targets = [], []
        for _, context, continuation in requests:
            whole = (context + continuation)[-(self.max_length + 1) :]
            inputs.append(whole[:-1])
            targets.append(continuation)
        order = sorted(range(len(inputs)), key=lambda index: -len(inputs[index]))  # similar lengths batch together
        scored = self.score([inputs[i] for i in order], [targets[i] for i in order])
        results: list[tuple[float, bool]] = [(0.0, False)] * len(inputs)
        for index, result in zip(order, scored):
            results[index] = result
            if self.cache_hook is not None and requests[index][0] is not None:
                self.cache_hook.add_partial("loglikelihood", requests[index][0], result)
        return results

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of whole texts, every token scored once from an ``<|endoftext|>``
        prefix, in windows of at most ``max_length`` tokens."""
        totals = []
        for (text,) in tqdm([request.args for request in requests], disable=disable_tqdm, desc="rolling"):
            windows = [make_disjoint_window(window) for window in get_rolling_token_windows(
                self.tok_encode(text), prefix_token=self._eot, max_seq_len=self.max_length, context_len=1)]
            scored = self._loglikelihood_tokens([(None, context, target) for context, target in windows])
            totals.append(sum(logprob for logprob, _ in scored))
        return totals

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or ``do_sample``) decoding from each context until a stop string or
        ``max_gen_toks`` tokens; the text is cut before the first stop string."""
        outputs = []
        for context, options in tqdm([request.args for request in requests], disable=disable_tqdm, desc="generating"):
            options = dict(options or {})
            stops = options.pop("until", None) or [self.tok_decode([self._eot])]
            stops = [stops] if isinstance(stops, str) else list(stops)
            max_new = int(options.pop("max_gen_toks", self.max_gen_toks))
            temperature = float(options.pop("temperature", 0.0)) if options.pop("do_sample", False) else 0.0
            context_ids = self.tok_encode(context)[-self.max_length :] or [self._eot]
            text = self.decode_until(context_ids, stops, max_new, temperature)
            outputs.append(text)
            self.cache_hook.add_partial("generate_until", (context, {"until": stops}), text)
        return outputs

    def decode_until(self, context_ids: list[int], stops: list[str], max_new_tokens: int, temperature: float) -> str:
        """Stream tokens from the model until the decoded text contains a stop string."""
        new_ids: list[int] = []
        prompt = torch.tensor([context_ids], device=self._device)
        for token in self.model.stream(prompt, max_new_tokens, temperature=temperature, eos_token_id=self._eot):
            if int(token) == self._eot:
                break
            new_ids.append(int(token))
            text = self.tok_decode(new_ids)
            if any(stop in text for stop in stops):
                break
        text = self.tok_decode(new_ids)
        cut = min((text.index(stop) for stop in stops if stop in text), default=len(text))
        return text[:cut]
