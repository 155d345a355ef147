"""The long-context probe: Delta_N is ~0 for a model that cannot see beyond its window and
positive below the lag of a model that copies from far back; its losses equal direct
computations for every registered architecture (the swapped control through each one's
decoding state); ``mcsd-probe context`` writes its CSVs and figure."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_module
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict
from tqdm.auto import tqdm

import mcsd
from helpers.models import tiny_model
from helpers.runs import run_here
from mcsd.checkpoint.saved_model import load_tokenizer
from mcsd.errors import MCSDError
from mcsd.models import CausalLM, LMConfig, TokenMixer, registry
from mcsd.probes.context import _losses, evaluation_positions, probe_context


class Delay(TokenMixer):
    """``y_t = scale * sum_{lag in lags} x_{t - lag}`` (zeros before the sequence); its state is
    the last ``max(lags)`` inputs. It sees exactly ``max(lags) + 1`` tokens, ignoring positions."""

    def __init__(self, config: DelayConfig) -> None:
        super().__init__()
        self.lags, self.scale = list(config.lags), config.scale

    def reset_parameters(self) -> None:
        """No parameters."""

    def init_state(self, batch_size: int, capacity: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(batch_size, max(self.lags), 0, device=device, dtype=dtype)  # width set by the first call

    def forward(self, x: torch.Tensor, state: torch.Tensor | None, position: int, form: str) -> tuple[Any, Any]:
        span = max(self.lags)
        history = x.new_zeros(x.shape[0], span, x.shape[2]) if state is None or state.shape[2] == 0 else state
        tokens = torch.cat([history, x], dim=1)
        length = x.shape[1]
        y = sum(tokens[:, span - lag:span - lag + length] for lag in self.lags)
        return self.scale * y, tokens[:, -span:]


@dataclasses.dataclass
class DelayConfig(LMConfig):
    lags: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2])
    scale: float = 1.0


class DelayForCausalLM(CausalLM):
    """The skeleton with :class:`Delay` mixers."""

    @classmethod
    def make_mixer(cls, config: DelayConfig, layer_index: int) -> TokenMixer:
        return Delay(config)


@pytest.fixture(scope="module")
def delay() -> Iterator[None]:
    mcsd.register(mcsd.Architecture(name="delay", config_class=DelayConfig, model_class=DelayForCausalLM,
                                    label="Delay", train_form="chunk"))
    try:
        yield
    finally:
        registry.unregister("delay")


VOCAB = 32


def delay_model(lags: list[int], num_layers: int, scale: float = 1.0) -> CausalLM:
    return mcsd.build_model({"_target_": f"{__name__}.DelayConfig", "vocab_size": VOCAB, "hidden_size": VOCAB,
                             "num_channels": 1, "num_layers": num_layers, "mlp_hidden_size": 16, "lags": lags,
                             "scale": scale}).eval()


def copier(period: int) -> CausalLM:
    """Predicts token ``t + 1`` as token ``t + 1 - period``: one-hot embeddings, a delay of
    ``period - 1`` that dominates the residual, no MLP, the LM head reading the one-hot back."""
    model = delay_model([period - 1], num_layers=1, scale=10.0)
    with torch.no_grad():
        model.embed.weight.copy_(torch.eye(VOCAB))
        model.lm_head.weight.copy_(5 * torch.eye(VOCAB))
        model.layers[0].mlp.down.weight.zero_()
    return model


def periodic_documents(count: int, length: int, period: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    base = torch.randint(0, VOCAB, (count, period), generator=generator)
    return base.repeat(1, length // period + 1)[:, :length]


def test_positions_lie_beyond_the_longest_window() -> None:
    assert evaluation_positions(100, [8, 32], 4) == [32, 54, 76, 98]
    with pytest.raises(MCSDError, match="length=40 leaves no position beyond the longest window 64"):
        evaluation_positions(40, [8, 64], 4)


def test_a_model_that_cannot_see_far_has_delta_zero(delay: None) -> None:
    """Two layers of a 3-token window see 5 tokens: beyond that, nothing changes."""
    model = delay_model([0, 1, 2], num_layers=2)
    documents = torch.randint(0, VOCAB, (6, 160), generator=torch.Generator().manual_seed(1))
    result = probe_context(model, documents, windows=[2, 5, 16, 64], num_positions=8, batch_size=3, bootstrap=200)
    deltas = result.deltas.set_index("window")
    # It does use 3 to 5 tokens back: cutting them changes the loss (up or down: random weights).
    assert abs(deltas.loc[2, "delta"]) > 0.01 and abs(deltas.loc[2, "swapped"]) > 0.01
    for window in (5, 16, 64):
        assert abs(deltas.loc[window, "delta"]) < 1e-5 and abs(deltas.loc[window, "swapped"]) < 1e-5
        assert deltas.loc[window, "delta_low"] <= deltas.loc[window, "delta"] <= deltas.loc[window, "delta_high"]


def test_a_model_that_copies_from_far_back_has_delta_positive_below_its_lag(delay: None) -> None:
    period = 48
    model = copier(period)
    documents = periodic_documents(6, 200, period)
    result = probe_context(model, documents, windows=[16, 32, 64, 128], num_positions=6, batch_size=4, bootstrap=200)
    deltas = result.deltas.set_index("window")
    assert deltas.loc[128, "loss_full"] < 0.05  # it predicts the periodic text almost perfectly
    for window in (16, 32):  # the copied token lies outside the window: both differences are large
        assert deltas.loc[window, "delta"] > 5 and deltas.loc[window, "delta_low"] > 5
        assert deltas.loc[window, "swapped"] > 5 and deltas.loc[window, "swapped_low"] > 5
    for window in (64, 128):
        assert abs(deltas.loc[window, "delta"]) < 1e-5 and abs(deltas.loc[window, "swapped"]) < 1e-5
    # The per-position curve: the first period cannot be predicted, the rest can.
    curve = result.curve
    assert list(curve["bin_start"]) == [0, 1, 2, 4, 8, 16, 32, 64, 128] and curve["bin_end"].iloc[-1] == 199
    assert curve.set_index("bin_start").loc[64, "loss"] < 0.05 < curve.set_index("bin_start").loc[8, "loss"]


@pytest.mark.parametrize("arch", registry.architectures())
def test_probe_losses_equal_direct_computation(arch: str) -> None:
    """For every registered architecture, the last-N and swapped losses are those of the model
    run on the truncated and on the spliced sequence from scratch (the splice continues a
    copied decoding state; the last-N windows go several to a call)."""
    torch.manual_seed(0)
    model = tiny_model(arch).eval()
    vocab = model.config.vocab_size
    documents, others = torch.randint(0, vocab, (2, 2, 80)).unbind(0)
    windows, positions = [8, 24], [30, 55, 78]
    with torch.no_grad():
        full, windowed = _losses(model, documents, others, windows, positions, model.default_form, max_tokens=50,
                                 progress=tqdm(disable=True))
        assert torch.allclose(full, F.cross_entropy(model(documents[:, :-1]).transpose(1, 2), documents[:, 1:],
                                                    reduction="none"), atol=1e-5)
        for w, window in enumerate(windows):
            for p, t in enumerate(positions):
                start = t - window + 1
                last = model(documents[:, start:t + 1])[:, -1]
                spliced = model(torch.cat([others[:, :start], documents[:, start:t + 1]], dim=1))[:, -1]
                target = documents[:, t + 1]
                assert torch.allclose(windowed["last"][:, w, p], F.cross_entropy(last, target, reduction="none"),
                                      atol=1e-4)
                assert torch.allclose(windowed["swapped"][:, w, p], F.cross_entropy(spliced, target, reduction="none"),
                                      atol=1e-4)


def test_mcsd_probe_context_writes_the_probe_of_the_documents_it_cuts(tmp_path: Path) -> None:
    """``mcsd-probe context`` cuts each document (after <|endoftext|>, as in training) into
    consecutive pieces of ``length`` tokens, probes the first ``num_documents`` through the saved
    model and writes exactly what :func:`probe_context` gives on them; ``mcsd-plot context``
    draws the folder; a corpus too short for one piece is refused in one line."""
    from mcsd.data.tokenizer import train_tokenizer

    words = "the king of a far land ships gold and silver to every harbour along the coast".split()
    rng = torch.Generator().manual_seed(3)
    texts = [" ".join(words[i] for i in torch.randint(0, len(words), (count,), generator=rng)) for count in (500, 4000)]
    paths = [tmp_path / "short.txt", tmp_path / "long.txt"]
    for path, text in zip(paths, texts):
        path.write_text(text)
    tokenizer = train_tokenizer(texts, 300)
    model = tiny_model("mcsd", vocab_size=300)
    mcsd.save(model, tmp_path / "model", tokenizer)
    length, count = 192, 5
    pieces = []
    for text in texts:
        ids = [0] + tokenizer.encode(text).ids  # <|endoftext|> is id 0
        pieces += [ids[start:start + length] for start in range(0, len(ids) - length + 1, length)]
    assert len(pieces) > count and len([0] + tokenizer.encode(texts[0]).ids) // length in (1, 2, 3)
    expected = probe_context(model, torch.tensor(pieces[:count]), windows=[16, 64], num_positions=5, batch_size=2,
                             bootstrap=50, seed=7, max_tokens=100).deltas

    common = ["ckpt=model", "data=text_files", f"data.paths=[{paths[0]},{paths[1]}]", "windows=[16,64]",
              "num_positions=5", "batch_size=2", "bootstrap=50", "seed=7", "max_tokens=100", "wandb.enabled=false",
              "paths.log_dir=logs"]
    result = run_here("mcsd-probe", "context", *common, f"length={length}", f"num_documents={count}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (f"probing MCSD full on {count} pieces of {length} tokens: data=text_files's documents in order (the "
            "model's training data is not recorded beside it)") in result.stdout.splitlines()
    (run_dir,) = (tmp_path / "logs" / "probe_context" / "runs").iterdir()
    deltas = pd.read_csv(run_dir / "context_delta.csv")
    pd.testing.assert_frame_equal(deltas[expected.columns], expected, check_exact=False, atol=1e-6)
    assert set(deltas["label"]) == {"MCSD full"} and set(deltas["form"]) == {model.default_form}
    curve = pd.read_csv(run_dir / "context_curve.csv")
    assert curve["bin_end"].iloc[-1] == length - 1 and (run_dir / "context_probe.png").stat().st_size > 0

    plotted = run_here("mcsd-plot", "context", "source=logs/probe_context", "name=side_by_side", 'curves=["MCSD full"]',
                      cwd=tmp_path)
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    assert (tmp_path / "logs" / "probe_context" / "side_by_side.png").is_file() and "MCSD full" in plotted.stdout
    unknown = run_here("mcsd-plot", "context", "source=logs/probe_context", "curves=[Transformer]", cwd=tmp_path)
    assert unknown.returncode == 2 and unknown.stderr.strip() == (
        "mcsd-plot: error: curves: no probe of 'Transformer' under logs/probe_context: use some of MCSD full")

    refused = run_here("mcsd-probe", "context", *common, "length=100000", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "mcsd-probe context: error: data=text_files has 0 piece(s) of length=100000 tokens; the probe needs at "
        "least 2: lower length or give longer documents"]
    assert len(list((tmp_path / "logs" / "probe_context" / "runs").iterdir())) == 1  # the refused run left nothing


def test_ctrl_c_keeps_the_probe_of_the_documents_finished_and_resume_reads_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while mcsd-probe context reads its second batch of 2 documents (of 5): that batch
    finishes, the third never starts; the probe written is that of the 4 documents finished
    (documents=4, documents_planned=5), Delta_N as the uninterrupted probe of those 4 gives it;
    exit status 130. ``resume=true`` in its folder reads the fifth document alone and writes what
    the uninterrupted probe of all 5 writes; with other windows it is refused in one line."""
    from mcsd.data.tokenizer import train_tokenizer
    from mcsd.probes import context as probe_module
    from mcsd.commands.probe import context

    text = " ".join(["the king of a far land ships gold and silver to every harbour"] * 300)
    (tmp_path / "corpus.txt").write_text(text)
    mcsd.save(tiny_model("mcsd", vocab_size=300), tmp_path / "model", train_tokenizer([text], 300))
    batches = []
    real = probe_module._losses

    def batch_then_ctrl_c(*arguments, **keywords):
        batches.append(len(arguments[1]))
        if len(batches) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # arrives while the batch is read, as a Ctrl-C would
        return real(*arguments, **keywords)

    def probe(count: int, name: str, *more: str) -> pd.DataFrame:
        with initialize_config_module("mcsd.conf", version_base="1.3"):
            cfg = compose("probe_context", overrides=[
                f"ckpt={tmp_path / 'model'}", "data=text_files", f"data.paths=[{tmp_path / 'corpus.txt'}]",
                "length=64", "windows=[8,16]", "num_positions=4", "batch_size=2", "bootstrap=20",
                f"num_documents={count}", "wandb.enabled=false", f"paths.output_dir={tmp_path / name}",
                f"paths.cache_dir={tmp_path / 'cache'}", *more],
                return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)  # as the app has it (data.name reads the choice of data)
        with open_dict(cfg):
            del cfg.hydra
        context(cfg)
        return pd.read_csv(tmp_path / name / "context_delta.csv")

    monkeypatch.setattr(probe_module, "_losses", batch_then_ctrl_c)
    try:
        with pytest.raises(SystemExit) as stopped:
            probe(5, "stopped")
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the app leaves Ctrl-C ignored as it exits
    assert stopped.value.code == 130 and batches == [2, 2]
    kept = pd.read_csv(tmp_path / "stopped" / "context_delta.csv")
    assert set(kept["documents"]) == {4} and set(kept["documents_planned"]) == {5}
    monkeypatch.setattr(probe_module, "_losses", real)
    whole = probe(4, "whole")
    columns = ["window", "delta", "delta_low", "delta_high", "loss_full", "loss_last"]  # not the swap partners
    pd.testing.assert_frame_equal(kept[columns], whole[columns])

    with pytest.raises(MCSDError, match=r"holds the results of an earlier mcsd-probe context run \(context_curve.csv, "
                                        r"context_delta.csv, context_losses.safetensors\): .*resume=true to read only "
                                        r"the documents it left unread, or overwrite=true"):
        probe(5, "stopped")  # a new probe into the stopped one's folder: refused, nothing of it replaced
    assert pd.read_csv(tmp_path / "stopped" / "context_delta.csv").equals(kept)
    with pytest.raises(MCSDError, match=r"^resume=true: the probe in .*stopped was read with windows=\[8, 16\] and "
                                        r"this run has windows=\[8, 24\]: resume with the same settings"):
        probe(5, "stopped", "resume=true", "windows=[8,24]")
    batches.clear()
    monkeypatch.setattr(probe_module, "_losses", lambda *arguments, **keywords: (
        batches.append(len(arguments[1])), real(*arguments, **keywords))[1])
    resumed = probe(5, "stopped", "resume=true")
    assert batches == [1]  # the fifth document alone
    all_five = probe(5, "all_five")
    pd.testing.assert_frame_equal(resumed, all_five)


def test_a_batchs_losses_are_on_the_cpu_whatever_the_models_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan brings each batch's losses to the CPU (the summary reads them with NumPy, and a
    resumed probe joins them to losses read from its file; on a GPU both failed). Here the
    model's losses come back on the meta device, standing in for a GPU's: the plan's copy to the
    CPU is what the meta device refuses (it has no data), where losses left on their device would
    pass through. tests/gpu/test_gpu.py runs the probe on CUDA."""
    from mcsd.probes import context as probe_module

    model = tiny_model("mcsd").eval()
    documents = torch.randint(0, model.config.vocab_size, (4, 80))
    plan = probe_module.ContextProbePlan(model, documents, [8, 24], num_positions=3, batch_size=2)
    real = probe_module._losses

    def on_another_device(*arguments: Any, **keywords: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        full, windowed = real(*arguments, **keywords)
        return full.to("meta"), {name: tensor.to("meta") for name, tensor in windowed.items()}

    monkeypatch.setattr(probe_module, "_losses", on_another_device)
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        plan.losses(0, tqdm(disable=True))
    monkeypatch.setattr(probe_module, "_losses", real)
    losses = plan.losses(0, tqdm(disable=True))
    assert {tensor.device.type for tensor in losses.tensors().values()} == {"cpu"}


def test_the_probes_bar_counts_every_token_the_model_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress bar's total is the tokens the probe feeds the model (its estimate follows the
    work, not a count of unequal passes), and it ends full."""
    import mcsd.probes.context as context_module

    bars = []

    class Recorded(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "disable": False})
            bars.append(self)

    model = tiny_model("mcsd").eval()
    fed = []
    forward, prefill = model.forward, model.prefill
    monkeypatch.setattr(model, "forward", lambda ids, *a, **k: (fed.append(ids.numel()), forward(ids, *a, **k))[1])
    monkeypatch.setattr(model, "prefill", lambda ids, *a, **k: (fed.append(ids.numel()), prefill(ids, *a, **k))[1])
    monkeypatch.setattr(context_module, "tqdm", Recorded)
    documents = torch.randint(0, model.config.vocab_size, (5, 80))
    probe_context(model, documents, [8, 24], num_positions=3, batch_size=2, bootstrap=0, max_tokens=50)
    (bar,) = bars
    assert bar.total == bar.n == sum(fed) > 0


@pytest.mark.slow
def test_mcsd_probe_context_reads_the_documents_the_run_held_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probing a run on the corpus it trained on read that corpus from its start: documents it
    trained on, said as "16 documents". It reads the documents the run held out of training (its
    test split, drawn as training drew it) and says so; another corpus is said to be another."""
    from hydra.utils import instantiate

    from helpers.runs import FAST
    from mcsd.checkpoint.run_folder import RunFolder

    words = "the king of a far land ships gold and silver to every harbour along the coast".split()
    rng = torch.Generator().manual_seed(5)
    paragraphs = [" ".join(words[i] for i in torch.randint(0, len(words), (200,), generator=rng)) for _ in range(40)]
    (tmp_path / "story.txt").write_text("\n\n".join(paragraphs) + "\n")
    data = ["data=text_files", "data.paths=[story.txt]", "data.sample_by=paragraph"]
    trained = run_here("mcsd-train", *FAST, *data, "logger=csv", "hydra.run.dir=run", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    logged = RunFolder(tmp_path / "run").logged_config()
    common = ["ckpt=run", "windows=[16]", "num_positions=3", "batch_size=2", "bootstrap=0", "length=64",
              "num_documents=6", "wandb.enabled=false"]
    result = run_here("mcsd-probe", "context", *common, *data, "output_dir=held_out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (f"probing MCSD full on 6 pieces of 64 tokens: the test documents the run held out of training "
            f"(data=text_files, {logged['data/test_documents']} documents)") in result.stdout.splitlines()
    model = mcsd.load(tmp_path / "run")
    monkeypatch.chdir(tmp_path)  # the run's data.paths are relative to where it ran
    split = instantiate({**logged["data"], "cache_dir": str(tmp_path / "cache")}, tokenizer=load_tokenizer(tmp_path / "run")
                        ).build()["test"]
    pieces = [ids[start:start + 64] for number in split.document_ids for ids in [split.store.document(int(number)).tolist()]
              for start in range(0, len(ids) - 63, 64)][:6]
    expected = probe_context(model, torch.tensor(pieces), windows=[16], num_positions=3, batch_size=2, bootstrap=0,
                             seed=0, max_tokens=16384).deltas
    deltas = pd.read_csv(tmp_path / "held_out" / "context_delta.csv")
    pd.testing.assert_frame_equal(deltas[expected.columns], expected, check_exact=False, atol=1e-6)
    other = run_here("mcsd-probe", "context", *common, "output_dir=other", cwd=tmp_path)  # data=embedded
    assert other.returncode == 0, other.stderr[-2000:]
    assert ("probing MCSD full on 6 pieces of 64 tokens: data=embedded's documents in order (not the corpus the model "
            "trained on)") in other.stdout.splitlines()
