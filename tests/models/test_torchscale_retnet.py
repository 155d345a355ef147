"""``model.implementation=torchscale``: RetNet with Microsoft's own retention layer inside the harness
(issue 90: RetNet's flat line through an independent implementation). Its forms agree with each
other, it equals this project's layer given the same weights, and it runs cast to 16 bits."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from helpers.runs import read_metrics, run_here, series
from helpers.models import SIXTEEN_BIT_TOLERANCE, decode_with_state, relative_rms_error, tiny_config, tiny_model
from mcsd.models import registry
from mcsd.models.build import build_model
from mcsd.models.config import ConfigError
from mcsd.models.retnet import torchscale_retention

pytest.importorskip("torchscale", reason="pip install --no-deps torchscale==0.3.0")

# torchscale's normalisations leave its retention outputs small beside the per-head norm's eps
# (the forms then differ by ~2% at the default 1e-6 with fresh weights); with a negligible eps what
# remains is round-off (torchscale's RMSNorm computes in fp32 whatever the model's dtype).
NEGLIGIBLE_EPS = 1e-20


@torch.no_grad()
def test_torchscales_forms_agree_and_decoding_continues_them() -> None:
    """Parallel, chunkwise (37 tokens: three chunks of 16, the last padded) and recurrent; a
    prefill followed by steps gives the parallel form's logits."""
    torch.manual_seed(0)
    model = tiny_model("retnet", implementation="torchscale", norm_eps=NEGLIGIBLE_EPS).double()
    assert all(type(layer.mixer).__name__ == "TorchscaleRetention" for layer in model.layers)
    input_ids = torch.randint(0, 101, (2, 37))
    reference = model(input_ids, form="parallel")
    for form in registry.get("retnet").forms:
        assert relative_rms_error(model(input_ids, form=form), reference) < 1e-6, form
    decoded, state = decode_with_state(model, input_ids, split=17)
    assert relative_rms_error(decoded, reference[:, 16:]) < 1e-6
    assert state.layers[0].mixer.shape == (2, 3, 16, 8)  # torchscale's prev_key_value, [B, H, dv, dk]


@torch.no_grad()
def test_torchscales_layer_equals_ours_given_the_same_weights() -> None:
    """Without RoPE (whose angles and pairing differ between the two), this project's retention and
    torchscale's, the same q, k, v, gate and output weights copied across, give the same logits in
    every form: torchscale's extra normalisations are per-row scalings that the per-head norm removes."""
    torch.manual_seed(0)
    ours = tiny_model("retnet", rope=False, norm_eps=NEGLIGIBLE_EPS).double()
    theirs = tiny_model("retnet", rope=False, implementation="torchscale", norm_eps=NEGLIGIBLE_EPS).double()
    weights = {}
    for name, tensor in ours.state_dict().items():
        if ".mixer.qk_proj." in name:
            query, key = tensor.chunk(2)
            weights[name.replace("qk_proj", "layer.q_proj")] = query
            weights[name.replace("qk_proj", "layer.k_proj")] = key
        elif ".mixer.vg_proj." in name:
            value, gate = tensor.view(2, -1, tensor.shape[-1]).unbind()
            weights[name.replace("vg_proj", "layer.v_proj")] = value
            weights[name.replace("vg_proj", "layer.g_proj")] = gate
        elif ".mixer.out_proj." in name:
            weights[name.replace("out_proj", "layer.out_proj")] = tensor
        elif ".mixer.norm." not in name:  # torchscale's per-head norm has no gain (ours: ones at init)
            weights[name] = tensor
    theirs.load_state_dict(weights)
    input_ids = torch.randint(0, 101, (2, 37))
    for form in registry.get("retnet").forms:
        assert relative_rms_error(theirs(input_ids, form=form), ours(input_ids, form=form)) < 1e-6, form


@pytest.mark.parametrize("dtype", list(SIXTEEN_BIT_TOLERANCE), ids=str)
@torch.no_grad()
def test_torchscales_layer_cast_to_16_bits_runs_every_form_and_decodes(dtype: torch.dtype) -> None:
    """``model.to(dtype)``: every form and decoding within the 16-bit tolerance of fp32, torchscale's
    arithmetic and state in the model's dtype (its norm in fp32)."""
    torch.manual_seed(0)
    model = tiny_model("retnet", implementation="torchscale", norm_eps=NEGLIGIBLE_EPS)
    input_ids = torch.randint(0, 101, (2, 40))
    reference = model(input_ids, form="parallel")
    cast = copy.deepcopy(model).to(dtype)
    for form in registry.get("retnet").forms:
        logits = cast(input_ids, form=form)
        assert logits.dtype == dtype and relative_rms_error(logits, reference) < SIXTEEN_BIT_TOLERANCE[dtype], form
    decoded, state = decode_with_state(cast, input_ids, split=17)
    assert relative_rms_error(decoded, reference[:, 16:]) < SIXTEEN_BIT_TOLERANCE[dtype]
    assert state.layers[0].mixer.dtype == dtype


def test_torchscales_sequence_forms_start_a_sequence_in_one_line() -> None:
    model = tiny_model("retnet", implementation="torchscale")
    _, state = model.prefill(torch.randint(0, 101, (1, 5)))
    with pytest.raises(ConfigError, match="continue one with form=recurrent"):
        model.run(torch.randint(0, 101, (1, 3)), state, "chunk")


@pytest.mark.parametrize(("fields", "message"), [
    ({"retention_norm": False}, "model.retention_norm=False is not a switch of torchscale's layer"),
    ({"short_conv": 4}, "model.short_conv=4 is not a switch of torchscale's layer"),
    ({"implementation": "fla"}, "model.implementation='fla' is unknown: use one of mcsd, torchscale"),
])
def test_torchscales_layer_refuses_what_it_has_not_in_one_line(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tiny_model("retnet", **{"implementation": "torchscale", **fields})


def test_without_torchscale_the_layer_names_its_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchscale.component.multiscale_retention", None)
    torchscale_retention.torchscale_retention_class.cache_clear()
    try:
        with pytest.raises(ConfigError, match="pip install --no-deps torchscale==0.3.0"):
            build_model(tiny_config("retnet", implementation="torchscale"))
    finally:
        torchscale_retention.torchscale_retention_class.cache_clear()


def test_mqar_trains_through_torchscales_layer_in_the_harness(tmp_path: Path) -> None:
    """``mcsd-train experiment=mqar_recall model=retnet model.implementation=torchscale``: the run
    trains torchscale's layer (its loss moves), logs MQAR's accuracy, and its config names the layer."""
    result = run_here("mcsd-train", "experiment=mqar_recall", "model=retnet", "model.implementation=torchscale",
                      "model.hidden_size=16", "data.seq_len=32", "data.num_train=64", "data.num_val=16",
                      "data.batch_size=16", "trainer.max_steps=4", "trainer.log_every_n_steps=1", "scheduler.warmup_steps=1", "logger=csv",
                      "test_after_training=false", "callbacks.progress_bar.refresh_rate=0",
                      f"paths.log_dir={tmp_path}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (hparams,) = tmp_path.rglob("hparams.yaml")
    assert "implementation: torchscale" in hparams.read_text()
    rows = read_metrics(hparams.parents[2])
    losses = series(rows, "train/loss")
    assert len(losses) == 4 and losses[max(losses)] != losses[min(losses)]
    accuracies = series(rows, "val/mqar_acc").values()
    assert accuracies and all(0 <= accuracy <= 1 for accuracy in accuracies)
