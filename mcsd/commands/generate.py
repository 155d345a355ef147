"""mcsd-generate: continue a prompt with a trained model, streaming the text as it comes.

    mcsd-generate ckpt=logs/train/runs/<run> prompt="The for statement"
    mcsd-generate ckpt=exported/my-model-onnx runtime=onnx   # an ONNX export, through ONNX Runtime
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import torch
from omegaconf import DictConfig

from mcsd.checkpoint.saved_model import load, load_tokenizer, locate, trained_seq_len
from mcsd.commands.app import hydra_app, refuse_onnx_export
from mcsd.data.tokenizer import EOS_TOKEN
from mcsd.deploy.quantize import decoding_dtype, quantize_weights
from mcsd.models.config import ConfigError


def check_sampling(cfg: DictConfig) -> None:
    """The sampling settings, refused in one line before the model is loaded."""
    def number(key: str) -> Any:
        value = cfg[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"{key}={value} must be a number")
        return value

    temperature, top_p = number("temperature"), number("top_p")
    if temperature is None or temperature < 0:
        raise ConfigError(f"temperature={temperature} must be 0 (greedy) or more (e.g. 0.8)")
    if top_p is not None and not 0 < top_p <= 1:
        raise ConfigError(f"top_p={top_p} must be a probability in (0, 1] (e.g. 0.9), or null")
    for key in ("top_k", "max_new_tokens"):
        value = cfg[key]
        if (value is not None or key == "max_new_tokens") and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"{key}={value} must be a positive whole number" + (", or null" if key == "top_k" else ""))
    for key in ("stop_at_eos", "compile", "cuda_graphs"):
        if not isinstance(cfg[key], bool):
            raise ConfigError(f"{key}={cfg[key]} must be true or false")


RUNTIMES = ("torch", "onnx")


def generate(cfg: DictConfig) -> str:
    """Decode ``cfg.max_new_tokens`` tokens after ``cfg.prompt``, printing each piece; return the text."""
    check_sampling(cfg)
    runtime = cfg.get("runtime", "torch")
    if runtime not in RUNTIMES:
        raise ConfigError(f"runtime={runtime!r} is unknown: use torch, or onnx (an export of mcsd-export format=onnx)")
    if runtime == "onnx":
        return generate_onnx(cfg)
    refuse_onnx_export("mcsd-generate", cfg.ckpt, f"decode it with runtime=onnx (mcsd-generate ckpt={cfg.ckpt} "
                       "runtime=onnx)")
    weights = cfg.get("weights", "full")
    dtype = decoding_dtype(cfg.dtype, weights, cfg.device)  # refused before the model is read
    saved = locate(cfg.ckpt)  # read once for the model, its tokenizer and its trained length
    model = quantize_weights(load(saved, device=cfg.device, dtype=dtype), weights)
    tokenizer = load_tokenizer(saved)
    prompt_ids = tokenizer.encode(cfg.prompt).ids
    if not prompt_ids:
        raise ConfigError("prompt is empty: give some text to continue, e.g. prompt=\"The \"")
    trained = trained_seq_len(saved)
    if trained is not None and len(prompt_ids) + cfg.max_new_tokens > trained:
        print(f"mcsd-generate: warning: the prompt ({len(prompt_ids):,} tokens) and max_new_tokens={cfg.max_new_tokens} "
              f"reach past the {trained:,} tokens a sequence had in training (data.seq_len): text beyond them may "
              "degrade; shorten the prompt or max_new_tokens", file=sys.stderr, flush=True)
    generator = torch.Generator(device=cfg.device).manual_seed(cfg.seed)
    eos = tokenizer.token_to_id(EOS_TOKEN) if cfg.stop_at_eos else None
    stream = model.stream(torch.tensor([prompt_ids], device=cfg.device), cfg.max_new_tokens,
                          temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, eos_token_id=eos,
                          generator=generator, compile=cfg.compile, cuda_graphs=cfg.cuda_graphs)
    return print_stream(cfg.prompt, (int(token) for token in stream), tokenizer, eos)


def generate_onnx(cfg: DictConfig) -> str:
    """:func:`generate` through an ONNX export (:mod:`mcsd.deploy.onnx_runner`): its tokenizer, its
    graphs in ONNX Runtime on the CPU."""
    import numpy as np

    from mcsd.deploy.onnx_runner import OnnxDecoder, OnnxExportError

    fixed = {"compile": False, "cuda_graphs": False, "device": "cpu", "dtype": "auto", "weights": "full"}
    set_here = [f"{key}={cfg.get(key)}" for key, value in fixed.items() if cfg.get(key, value) != value]
    if set_here:
        raise ConfigError(f"runtime=onnx runs the export as it was written, on the CPU: drop {', '.join(set_here)}")
    try:
        decoder = OnnxDecoder(cfg.ckpt, threads=torch.get_num_threads())
        tokenizer = decoder.tokenizer()
        prompt_ids = tokenizer.encode(cfg.prompt).ids
        if not prompt_ids:
            raise ConfigError("prompt is empty: give some text to continue, e.g. prompt=\"The \"")
        eos = decoder.manifest.get("eos_token_id") if cfg.stop_at_eos else None
        decoder.check_room(len(prompt_ids) + cfg.max_new_tokens - 1)  # the last token is never stepped
        stream = decoder.stream(np.array([prompt_ids]), cfg.max_new_tokens, temperature=cfg.temperature,
                                top_k=cfg.top_k, top_p=cfg.top_p, eos_token_id=eos, seed=cfg.seed)
        return print_stream(cfg.prompt, (int(tokens[0]) for tokens in stream), tokenizer, eos)
    except OnnxExportError as error:
        raise ConfigError(f"ckpt={cfg.ckpt}: {error}") from None


def print_stream(prompt: str, tokens: Iterator[int], tokenizer: Any, eos: int | None) -> str:
    """Print ``prompt``, then the text of ``tokens`` as it comes (up to ``eos``); return it all."""
    new_ids: list[int] = []
    printed = ""
    sys.stdout.write(prompt)
    for token in tokens:
        if eos is not None and token == eos:
            break
        new_ids.append(token)
        text = tokenizer.decode(new_ids)
        if not text.endswith("\ufffd"):  # wait until a multi-byte character is complete
            sys.stdout.write(text[len(printed):])
            sys.stdout.flush()
            printed = text
    sys.stdout.write("\n")
    return prompt + tokenizer.decode(new_ids)


@hydra_app("mcsd-generate", "generate")
def main(cfg: DictConfig) -> None:
    """Entry point of ``mcsd-generate``."""
    generate(cfg)


if __name__ == "__main__":
    main()
