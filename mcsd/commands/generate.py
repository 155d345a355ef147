"""mcsd-generate: continue a prompt with a trained model, streaming the text as it comes.

    mcsd-generate ckpt=logs/train/runs/<run> prompt="The for statement"
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from omegaconf import DictConfig

from mcsd.checkpoint.saved_model import load, load_tokenizer, trained_seq_len
from mcsd.commands.app import hydra_app
from mcsd.data.tokenizer import EOS_TOKEN
from mcsd.models.config import ConfigError
from mcsd.precision import model_dtype


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


def generate(cfg: DictConfig) -> str:
    """Decode ``cfg.max_new_tokens`` tokens after ``cfg.prompt``, printing each piece; return the text."""
    check_sampling(cfg)
    model = load(cfg.ckpt, device=cfg.device, dtype=model_dtype(cfg.dtype, cfg.device))
    tokenizer = load_tokenizer(cfg.ckpt)
    prompt_ids = tokenizer.encode(cfg.prompt).ids
    if not prompt_ids:
        raise ConfigError("prompt is empty: give some text to continue, e.g. prompt=\"The \"")
    trained = trained_seq_len(cfg.ckpt)
    if trained is not None and len(prompt_ids) + cfg.max_new_tokens > trained:
        print(f"mcsd-generate: warning: the prompt ({len(prompt_ids):,} tokens) and max_new_tokens={cfg.max_new_tokens} "
              f"reach past the {trained:,} tokens a sequence had in training (data.seq_len): text beyond them may "
              "degrade; shorten the prompt or max_new_tokens", file=sys.stderr, flush=True)
    generator = torch.Generator(device=cfg.device).manual_seed(cfg.seed)
    eos = tokenizer.token_to_id(EOS_TOKEN) if cfg.stop_at_eos else None
    new_ids: list[int] = []
    printed = ""
    sys.stdout.write(cfg.prompt)
    stream = model.stream(torch.tensor([prompt_ids], device=cfg.device), cfg.max_new_tokens,
                          temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, eos_token_id=eos,
                          generator=generator, compile=cfg.compile, cuda_graphs=cfg.cuda_graphs)
    for token in stream:
        if eos is not None and int(token) == eos:
            break
        new_ids.append(int(token))
        text = tokenizer.decode(new_ids)
        if not text.endswith("\ufffd"):  # wait until a multi-byte character is complete
            sys.stdout.write(text[len(printed):])
            sys.stdout.flush()
            printed = text
    sys.stdout.write("\n")
    return cfg.prompt + tokenizer.decode(new_ids)


@hydra_app("mcsd-generate", "generate")
def main(cfg: DictConfig) -> None:
    """Entry point of ``mcsd-generate``."""
    generate(cfg)


if __name__ == "__main__":
    main()
