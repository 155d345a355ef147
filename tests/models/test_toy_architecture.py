"""A new architecture is one registration: a toy defined in this file (a mixer that passes on
the previous token, and as its MLP a channel mixer with a state of its own, as RWKV-4's)
builds, passes the form checks, trains through mcsd-train, benches one point and gets its
plot labels, enters the architecture comparison's table, with no file of the package touched."""

from __future__ import annotations

import dataclasses
import importlib.resources
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from torch import nn

import mcsd
from helpers.models import relative_rms_error
from helpers.runs import FAST, compose_train, read_metrics, series, train_refusal
from mcsd.models import CausalLM, ForwardContext, LMConfig, TokenMixer, registry
from mcsd.plots.cost import model_label, plot_inference
from mcsd.plots.compare import comparison_table, markdown_comparison, plot_comparison
from mcsd.plots.runs import load_csv_runs, plot_sweep
from mcsd.probes.context import probe_context
from mcsd.commands.probe import model_identity, write_context_probe
from mcsd.training.run import train
from helpers.runs import TINY_INFERENCE, run_bench
from helpers.models import decode_all

pytestmark = pytest.mark.slow  # end-to-end runs, every test here


class PreviousToken(TokenMixer):
    """``y_n = W x_{n-1}`` (``x_{-1}``: the state, zeros at the start); the state is the last token."""

    def __init__(self, config: ToyConfig) -> None:
        super().__init__()
        self.init_std = config.init_std
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.out_proj.weight, std=self.init_std)

    def residual_weights(self) -> list[nn.Parameter]:
        return [self.out_proj.weight]

    def sequence_flops(self, length: int, context: ForwardContext) -> int:
        return 0  # a shift by one position: no sum over positions

    def forward(self, x: torch.Tensor, state: torch.Tensor | None, position: int,
                context: ForwardContext) -> tuple[Any, Any]:
        previous = torch.zeros_like(x[:, :1]) if state is None else state[:, None].to(x.dtype)
        shifted = torch.cat([previous, x[:, :-1]], dim=1)
        return self.out_proj(shifted), x[:, -1].float()


@dataclasses.dataclass
class ToyConfig(LMConfig):
    """The skeleton's fields and nothing more: a config is data."""


class ToyForCausalLM(CausalLM):
    """The skeleton with :class:`PreviousToken` mixers."""

    @classmethod
    def make_mixer(cls, config: ToyConfig, layer_index: int) -> TokenMixer:
        return PreviousToken(config)

    @classmethod
    def make_mlp(cls, config: ToyConfig, layer_index: int) -> TokenMixer:
        return PreviousToken(config)  # a channel mixer that keeps the last token as its state


@pytest.fixture(scope="module")
def toy() -> Iterator[registry.Architecture]:
    architecture = mcsd.register(mcsd.Architecture(name="toy", config_class=ToyConfig, model_class=ToyForCausalLM,
                                                   label="Toy", train_form="parallel"))
    try:
        yield architecture
    finally:
        registry.unregister("toy")
    assert "toy" not in mcsd.architectures()


def test_the_toy_is_registered_without_a_config_file(toy: registry.Architecture) -> None:
    assert mcsd.architectures()[-1] == "toy"
    assert not (importlib.resources.files("mcsd.conf") / "model" / "toy.yaml").is_file()
    model = mcsd.build_model({"_target_": f"{__name__}.ToyConfig", "vocab_size": 50, "hidden_size": 16,
                              "num_channels": 2, "num_layers": 2, "mlp_hidden_size": 32}).eval()
    assert isinstance(model, ToyForCausalLM) and model.default_form == "parallel"
    ids = torch.randint(0, 50, (2, 40))
    with torch.no_grad():
        _, state = model.prefill(ids[:, :5])
        assert all(layer.mlp.shape == layer.mixer.shape == (2, 16) for layer in state.layers)  # the MLP's own state
        reference = model(ids, form="parallel")
        assert relative_rms_error(decode_all(model, ids, split=10, hint=False), reference[:, 9:]) < 1e-6
        assert relative_rms_error(model(ids, form="recurrent"), reference) < 1e-6
        # A mixer that does not say it keeps documents apart: a packed batch of them is refused.
        with pytest.raises(mcsd.ConfigError, match="^toy cannot keep the documents of a packed batch apart yet: use "
                                                   "data.documents=joined$"):
            model(ids, position_ids=torch.arange(40).repeat(2, 1))


def test_the_toy_trains_benches_plots_and_enters_the_comparison(toy: registry.Architecture, tmp_path: Path) -> None:
    compare = tmp_path / "compare"  # the layout of experiments/compare_architectures/<corpus>/
    run_dir = compare / "0"
    assert ("data.documents=apart: toy cannot keep the documents of a packed batch apart yet: use "
            "data.documents=joined") in train_refusal(tmp_path / "apart", "model=toy", *FAST, "data.documents=apart")
    train(compose_train(run_dir, "model=toy", *FAST, "logger=csv"))
    assert len(series(read_metrics(run_dir), "train/loss")) == 6
    loaded = mcsd.load(run_dir)
    assert isinstance(loaded.config, ToyConfig) and loaded.config.hidden_size == 64  # size=tiny
    params = sum(p.numel() for p in loaded.parameters())
    assert plot_sweep("scaling", load_csv_runs(run_dir), tmp_path / "plots").labels == [
        f"Toy tiny ({params / 1e6:.1f}M)"]

    # One point, in this process: a fresh benchmark process would not have the toy registered.
    csv_path = run_bench(compare / "bench_inference", *TINY_INFERENCE, "models=[toy]", "inference.batch_sizes=[1]",
                         "inference.gen_lengths=[4]", "isolate=false")
    frame = pd.read_csv(csv_path)
    assert list(frame["arch"]) == ["toy"] and (frame["status"] == "ok").all()
    assert model_label("toy", "toy") == "Toy" and len(plot_inference(csv_path, tmp_path / "plots")) == 10

    # The comparison: a row for each architecture with a result, here the toy alone (its default
    # variant), its cells from its own run, bench point and probe; no row for the others.
    documents = torch.randint(0, loaded.config.vocab_size, (3, 80))
    probe = probe_context(loaded, documents, windows=[8, 32], num_positions=4, bootstrap=20)
    write_context_probe(probe, {**model_identity(loaded), "ckpt": str(run_dir), "form": "parallel"}, compare / "probe" / "0")
    comparison = comparison_table(compare)
    table = comparison.table.set_index("label")
    assert list(table.index) == ["Toy"]
    final_ppl = series(read_metrics(run_dir), "val/ppl")
    assert table.loc["Toy", "val_ppl"] == pytest.approx(final_ppl[max(final_ppl)]) and table.loc["Toy", "seeds"] == 1
    assert table.loc["Toy", "params"] == params
    assert table.loc["Toy", "decode_tokens_per_s"] == pytest.approx(1 / frame["decode_s_per_token"].iloc[0])
    assert table.loc["Toy", "state_bytes_per_sequence"] == frame["state_bytes_per_sequence"].iloc[0] == 2 * 2 * 64 * 4
    assert table.loc["Toy", "delta"] == pytest.approx(probe.deltas.set_index("window").loc[32, "delta"])
    markdown = markdown_comparison(comparison)
    assert markdown.count("\n| ") == 1 + 1 and "| Toy |" in markdown and "context: N=32, " in markdown
    assert [path.name for path in plot_comparison(comparison, tmp_path / "plots")] == [
        "architectures_compared.png", "architectures_compared.pdf", "architectures_compared_table.md"]
