"""The ONNX export of every registered architecture (mcsd.deploy.onnx) and its runner
(mcsd.deploy.onnx_runner): the prefill at any prompt length and batch and a 64-token greedy path
equal PyTorch's to round-off, the commands (mcsd-export format=onnx, mcsd-generate runtime=onnx),
and the inputs refused in one line."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import mcsd  # noqa: E402
from helpers.models import ONE_LAYER_OF_EACH_KIND, tiny_model  # noqa: E402
from helpers.runs import run_here  # noqa: E402
from mcsd.commands.generate import generate as mcsd_generate  # noqa: E402
from mcsd.data.tokenizer import train_tokenizer  # noqa: E402
from mcsd.deploy.onnx import MANIFEST_FILE, write_onnx_export  # noqa: E402
from mcsd.deploy.onnx_runner import OnnxDecoder, OnnxExportError, next_tokens  # noqa: E402
from mcsd.errors import MCSDError  # noqa: E402
from mcsd.models import registry  # noqa: E402
from mcsd.models.modules.attention import CausalSelfAttention  # noqa: E402

CAPACITY = 96
TOLERANCE = 1e-5  # fp32 logits, ONNX Runtime against PyTorch (the bar)


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple]:
    """``exports(arch)``: a tiny model of the architecture (one layer of each kind) and its ONNX
    export, made once for this file (an export takes 10-30 s here); a test that changes one copies it."""
    made: dict[str, tuple] = {}

    def export_of(arch: str) -> tuple:
        if arch not in made:
            torch.manual_seed(0)
            model = tiny_model(arch, **ONE_LAYER_OF_EACH_KIND.get(arch, {}))
            folder = tmp_path_factory.mktemp(f"onnx-{arch}")
            made[arch] = model, folder, write_onnx_export(model, folder, CAPACITY, eos_token_id=None)
        return made[arch]

    return export_of


@pytest.fixture(scope="module", params=registry.architectures())
def export(request: pytest.FixtureRequest, exports: Callable[[str], tuple]) -> tuple:
    return exports(request.param)


def test_prefill_at_any_length_and_batch_equals_pytorch(export) -> None:
    model, folder, manifest = export
    decoder = OnnxDecoder(folder)
    generator = torch.Generator().manual_seed(3)
    for batch, length in [(1, 1), (1, 2), (3, 17), (2, 64), (1, CAPACITY - 1)]:
        ids = torch.randint(0, model.config.vocab_size, (batch, length), generator=generator)
        with torch.no_grad():
            expected, _ = model.prefill(ids)
        logits, (position, state) = decoder.prefill(ids.numpy())
        assert position == length and len(state) == len(manifest["state"])
        assert np.abs(logits - expected.numpy()).max() < TOLERANCE, (batch, length)
    # Recurrent states stay fp32 in the graphs, as in PyTorch.
    assert all(entry["dtype"] == "float32" for entry in manifest["state"])


def test_a_greedy_path_of_64_tokens_equals_pytorch(export) -> None:
    model, folder, _ = export
    decoder = OnnxDecoder(folder)
    prompt = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected_logits, state = model.prefill(prompt)
        logits, onnx_state = decoder.prefill(prompt.numpy())
        for _ in range(64):
            assert np.abs(logits - expected_logits.numpy()).max() < TOLERANCE
            tokens = expected_logits.argmax(-1)
            assert np.array_equal(logits.argmax(-1), tokens.numpy())
            expected_logits, state = model.step(tokens, state)
            logits, onnx_state = decoder.step(tokens.numpy(), onnx_state)
        streamed = np.stack(list(decoder.stream(prompt.numpy(), 20)), 1)
        assert np.array_equal(streamed, model.generate(prompt, 20)[:, 9:].numpy())


def test_the_step_returns_a_kv_caches_entries_and_the_runner_writes_them_in_place(export) -> None:
    """A KV cache goes into the step whole and comes out as the token's entries, one position wide,
    which the runner writes at the position into the very array it was given; a recurrent state
    comes out whole."""
    model, folder, manifest = export
    decoder = OnnxDecoder(folder)
    _, (position, state) = decoder.prefill(np.arange(10, dtype=np.int64).reshape(2, 5) % model.config.vocab_size)
    tokens = np.array([3, 4], dtype=np.int64)
    feeds = {"token_ids": tokens, "position": np.asarray(position, dtype=np.int64),
             **{entry["name"]: array for entry, array in zip(manifest["state"], state)}}
    outputs = decoder.step_session.run(None, feeds)[1:]
    before = [array.copy() for array in state]
    _, (_, after) = decoder.step(tokens, (position, state))
    kinds = [entry["step_output"] for entry in manifest["state"]]
    attends = any(isinstance(module, CausalSelfAttention) for module in model.modules())
    assert ("entries" in kinds) == manifest["has_kv_cache"] == attends
    for kind, given, old, output, new in zip(kinds, state, before, outputs, after):
        if kind == "entries":
            assert output.shape == given.shape[:2] + (1,) + given.shape[3:]
            assert new is given and np.array_equal(given[:, :, position], output[:, :, 0])
            untouched = np.ones(given.shape[2], dtype=bool)
            untouched[position] = False
            assert np.array_equal(given[:, :, untouched], old[:, :, untouched])
        else:
            assert kind == "state" and output.shape == given.shape and np.array_equal(new, output)


def test_a_sequence_past_the_kv_cache_capacity_is_one_line(export) -> None:
    model, folder, manifest = export
    decoder = OnnxDecoder(folder)
    _, state = decoder.prefill(np.zeros((1, CAPACITY - 1), dtype=np.int64))
    _, state = decoder.step(np.zeros(1, dtype=np.int64), state)  # the last position
    if not manifest["has_kv_cache"]:  # a recurrent state has no end
        decoder.step(np.zeros(1, dtype=np.int64), state)
        return
    with pytest.raises(OnnxExportError, match=f"past the {CAPACITY} positions this export's KV caches hold"):
        decoder.step(np.zeros(1, dtype=np.int64), state)


# The largest logit error along the 64-token greedy path of every architecture's tiny model, relative
# to the largest logit, against PyTorch's full weights: three times what was measured with the
# activations in int8 too (ONNX_ACCURACY_LEVEL; int8 1.02e-2-1.30e-2, int4 0.111-0.144: widths of
# 24-48 inputs, padded to a block of 32; with fp32 activations int8 was 6.5e-3-8.5e-3).
QUANTIZED_TOLERANCE = {"int8": 4e-2, "int4": 0.45}


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_a_quantized_export_decodes_within_its_measured_tolerance(export, weights: str, tmp_path: Path) -> None:
    """``weights=int8|int4``: every linear of the model is a MatMulNBits in both graphs (the step's
    Gemm rows rewritten as MatMul first), the weights stored take fewer bytes, and the 64-token
    greedy path's logits stay within the measured tolerance of PyTorch's with full weights. The
    graphs are the module's full export quantized as ``write_onnx_export(weights=...)`` does it
    (a second export of each architecture doubled this file's time; the command test exports
    with ``weights=int8`` end to end)."""
    import onnx
    from onnx import helper

    from mcsd.deploy.onnx import ONNX_ACCURACY_LEVEL, PREFILL_FILE, STEP_FILE, graph_weight_bytes, quantize_onnx_weights

    model, full_folder, _ = export
    shutil.copytree(full_folder, tmp_path, dirs_exist_ok=True)
    linears = sum(isinstance(module, torch.nn.Linear) for module in model.modules())
    assert {name: quantize_onnx_weights(tmp_path / name, weights) for name in (PREFILL_FILE, STEP_FILE)} == {
        PREFILL_FILE: linears, STEP_FILE: linears}
    levels = {helper.get_attribute_value(attribute) for node in onnx.load(str(tmp_path / STEP_FILE)).graph.node
              if node.op_type == "MatMulNBits" for attribute in node.attribute if attribute.name == "accuracy_level"}
    assert levels == {ONNX_ACCURACY_LEVEL}  # int8 compute: the fast kernels
    assert graph_weight_bytes(tmp_path / STEP_FILE)[1] < graph_weight_bytes(full_folder / STEP_FILE)[1]
    decoder = OnnxDecoder(tmp_path)
    prompt = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(4))
    errors = []
    with torch.no_grad():
        expected_logits, state = model.prefill(prompt)
        logits, onnx_state = decoder.prefill(prompt.numpy())
        for _ in range(64):
            errors.append(np.abs(logits - expected_logits.numpy()).max() / np.abs(expected_logits.numpy()).max())
            tokens = expected_logits.argmax(-1)  # PyTorch's path, so that both read the same tokens
            expected_logits, state = model.step(tokens, state)
            logits, onnx_state = decoder.step(tokens.numpy(), onnx_state)
    assert 0 < max(errors) < QUANTIZED_TOLERANCE[weights]


def test_sampling_is_seeded_and_its_limits_hold() -> None:
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 4000))
    assert np.array_equal(next_tokens(logits[:2], 0.0, None, None, np.random.default_rng(0)), [0, 0])
    first = next_tokens(logits, 1.0, None, None, np.random.default_rng(7))
    assert np.array_equal(first, next_tokens(logits, 1.0, None, None, np.random.default_rng(7)))
    assert abs(np.mean(first == 0) - 0.5) < 0.03 and abs(np.mean(first == 3) - 0.05) < 0.015
    assert set(next_tokens(logits, 1.0, 2, None, np.random.default_rng(1)).tolist()) == {0, 1}
    # top_p: the smallest set reaching 0.75 is {0, 1}; 0.45 is reached by token 0 alone.
    assert set(next_tokens(logits, 1.0, None, 0.75, np.random.default_rng(2)).tolist()) == {0, 1}
    assert set(next_tokens(logits, 1.0, None, 0.45, np.random.default_rng(2)).tolist()) == {0}


def test_the_runner_imports_neither_torch_nor_mcsd() -> None:
    source = Path(sys.modules[OnnxDecoder.__module__].__file__).read_text()
    assert "import torch" not in source and "from mcsd" not in source and "import mcsd" not in source


def test_mcsd_export_format_onnx_and_mcsd_generate_runtime_onnx(tmp_path: Path) -> None:
    text = "the king of a far land ships gold and silver to every harbour along the coast\n\n" * 20
    tokenizer = train_tokenizer([text], 300)
    torch.manual_seed(0)
    model = tiny_model("transformer", vocab_size=300)
    saved = mcsd.save(model, tmp_path / "saved", tokenizer)  # a KV cache
    out = tmp_path / "onnx"
    result = run_here("mcsd-export", f"ckpt={saved}", f"out={out}", "format=onnx", "capacity=64")
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in out.iterdir()) == ["README.md", MANIFEST_FILE, "prefill.onnx", "step.onnx",
                                                          "tokenizer.json"]
    assert json.loads((out / MANIFEST_FILE).read_text())["capacity"] == 64
    settings = {"prompt": "the king", "max_new_tokens": 16, "temperature": 0, "top_k": None, "top_p": None,
                "seed": 0, "device": "cpu", "dtype": "auto", "stop_at_eos": False, "compile": False,
                "cuda_graphs": False}
    onnx = mcsd_generate(OmegaConf.create({"ckpt": str(out), "runtime": "onnx", **settings}))
    assert onnx == mcsd_generate(OmegaConf.create({"ckpt": str(saved), **settings}))
    quantized = run_here("mcsd-export", f"ckpt={saved}", f"out={tmp_path / 'onnx-int8'}", "format=onnx",
                         "capacity=64", "weights=int8")
    assert quantized.returncode == 0, quantized.stderr
    manifest = json.loads((tmp_path / "onnx-int8" / MANIFEST_FILE).read_text())
    linears = sum(isinstance(module, torch.nn.Linear) for module in model.modules())
    assert manifest["weights"] == "int8" and manifest["quantized_matmuls"] == {"prefill.onnx": linears,
                                                                              "step.onnx": linears}
    assert "linear weights int8, ONNX Runtime's MatMulNBits" in (tmp_path / "onnx-int8" / "README.md").read_text()
    assert len(mcsd_generate(OmegaConf.create({"ckpt": str(tmp_path / "onnx-int8"), "runtime": "onnx", **settings}))) > 0
    # Exporting again over it needs overwrite=true; a transformers folder is no earlier ONNX export.
    again = run_here("mcsd-export", f"ckpt={saved}", f"out={out}", "format=onnx")
    assert again.returncode == 2 and "exists (an earlier ONNX export)" in again.stderr
    bad = [(["format=gguf"], "format='gguf' is not an export format"),
           (["format=onnx", "capacity=1"], "capacity=1 must be a whole number of positions, at least 2"),
           (["format=onnx", "weights=int2"], "weights='int2' is not a weight format of an ONNX export: use full, "
                                             "int8 or int4"),
           (["weights=int8"], "weights=int8 quantizes an ONNX export (format=onnx); a transformers folder holds full")]
    for overrides, message in bad:
        refused = run_here("mcsd-export", f"ckpt={saved}", f"out={tmp_path / 'other'}", *overrides)
        assert refused.returncode == 2 and message in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "other").exists()
    long = run_here("mcsd-generate", f"ckpt={out}", "runtime=onnx", "max_new_tokens=80")
    assert long.returncode == 2 and "past the 64 positions" in long.stderr
    compiled = run_here("mcsd-generate", f"ckpt={out}", "runtime=onnx", "compile=true")
    assert compiled.returncode == 2 and "runtime=onnx runs the export as it was written" in compiled.stderr
    missing = run_here("mcsd-generate", f"ckpt={saved}", "runtime=onnx")
    assert missing.returncode == 2 and "is not an ONNX export of mcsd" in missing.stderr
    torch_runtime = run_here("mcsd-generate", f"ckpt={out}")  # was "holds no config.json ...: an mcsd-export folder"
    assert torch_runtime.returncode == 2 and (f"ckpt={out} is an ONNX export (mcsd-export format=onnx), which "
                                              "mcsd-generate does not read: decode it with runtime=onnx") in torch_runtime.stderr
    # A transformers export over an ONNX one (and back) is an earlier export, not a folder of unknown files.
    as_hf = run_here("mcsd-export", f"ckpt={saved}", f"out={out}")
    assert as_hf.returncode == 2 and f"out={out} exists (an earlier ONNX export): choose a new folder" in as_hf.stderr
    assert run_here("mcsd-export", f"ckpt={saved}", f"out={out}", "overwrite=true").returncode == 0
    assert (out / "modeling_mcsd.py").is_file() and not (out / "step.onnx").exists()
    back = run_here("mcsd-export", f"ckpt={saved}", f"out={out}", "format=onnx", "capacity=64")
    assert back.returncode == 2 and "exists (an earlier transformers export)" in back.stderr


def test_an_export_killed_between_its_renames_puts_the_earlier_one_back(
        tmp_path: Path, exports: Callable[[str], tuple]) -> None:
    """SIGKILL while an export replaced an earlier one left .OUT.XXXX/ beside it (the earlier export
    in earlier/, a half-written new/): the next export puts the earlier one back, then goes on."""
    text = "the king of a far land ships gold and silver to every harbour along the coast\n\n" * 20
    torch.manual_seed(0)
    saved = mcsd.save(tiny_model("retnet", vocab_size=300), tmp_path / "saved", train_tokenizer([text], 300))
    out = tmp_path / "onnx"
    shutil.copytree(exports("retnet")[1], out)  # the earlier export
    manifest = (out / MANIFEST_FILE).read_text()
    work = tmp_path / ".onnx.killed"
    (work / "new").mkdir(parents=True)
    (work / "new" / "step.onnx").write_bytes(b"half")
    (work / "pid").write_text("999999999\n")  # no such process
    out.rename(work / "earlier")
    refused = run_here("mcsd-export", f"ckpt={saved}", f"out={out}", "format=onnx", "capacity=16")
    assert refused.returncode == 2 and "exists (an earlier ONNX export)" in refused.stderr
    assert (out / MANIFEST_FILE).read_text() == manifest and not work.exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["onnx", "saved"]


def test_an_export_that_fails_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mcsd.deploy.onnx as onnx_export

    def broken(*_args, **_kwargs):
        raise RuntimeError("no translation for aten.made_up")

    monkeypatch.setattr(onnx_export.torch.onnx, "export", broken)
    with pytest.raises(MCSDError, match="exporting prefill.onnx failed .RuntimeError: no translation for aten.made_up."):
        write_onnx_export(tiny_model("retnet"), tmp_path, 16, None)


def test_runtimes_are_a_bench_axis(tmp_path: Path) -> None:
    """``runtimes=[torch,onnx]``: each point decoded by PyTorch and by ONNX Runtime through the
    model's export, each with each weight format (ONNX Runtime's own quantization for the
    export); each row says which, and an ONNX row's weight bytes are its step graph's."""
    from helpers.runs import run_bench
    from mcsd.plots.cost import model_label, read_results

    csv_path = run_bench(tmp_path, "model_size=tiny", "models=[transformer]", "runtimes=[torch,onnx]",
                         "weights=[full,int8]", "inference.batch_sizes=[2]", "inference.gen_lengths=[4]",
                         "inference.prompt_len=8", "inference.repeats=1", "inference.warmup=0", "isolate=false")
    frame = pd.read_csv(csv_path)
    assert list(zip(frame["runtime"], frame["weights"])) == [("torch", "full"), ("torch", "int8"), ("onnx", "full"),
                                                             ("onnx", "int8")]
    assert (frame["status"] == "ok").all() and (frame["tokens_per_s"] > 0).all()
    onnx, onnx_int8 = frame[frame["runtime"] == "onnx"].iloc[0], frame[frame["runtime"] == "onnx"].iloc[1]
    assert onnx_int8.step_weight_bytes < onnx.step_weight_bytes and onnx_int8.weights_bytes < onnx.weights_bytes
    # The export's KV caches hold prompt_len + gen_len = 12 positions: 2 layers x keys and values x 12 x 64 fp32.
    assert onnx.state_bytes_per_sequence == 2 * 2 * 12 * 64 * 4
    labels = [model_label(arch, model) for arch, model in zip(*[read_results(csv_path)[1][key] for key in ("arch", "model")])]
    assert labels == ["Transformer, full weights, PyTorch", "Transformer, int8 weights, PyTorch",
                      "Transformer, full weights, ONNX Runtime", "Transformer, int8 weights, ONNX Runtime"]


def test_a_damaged_export_is_one_line(tmp_path: Path, exports: Callable[[str], tuple]) -> None:
    """A truncated graph or manifest, a missing tokenizer or another export's step ended in a traceback
    (the last after the first printed token): each is one line naming the file and the fix, on loading."""
    text = "the king of a far land ships gold and silver to every harbour along the coast\n\n" * 20
    tokenizer = train_tokenizer([text], 300)
    # The file's exports with a tokenizer beside the graphs, as mcsd-export writes one (each case fails on loading).
    whole = {}
    for name in ("mcsd", "transformer"):
        whole[name] = shutil.copytree(exports(name)[1], tmp_path / name)
        tokenizer.save(str(whole[name] / "tokenizer.json"))

    def damaged(label: str, change) -> Path:
        folder = tmp_path / label
        shutil.copytree(whole["mcsd"], folder)
        change(folder)
        return folder

    def cut(path: Path) -> None:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    cases = [
        (damaged("cut-step", lambda folder: cut(folder / "step.onnx")), "step.onnx is not a readable ONNX graph ("),
        (damaged("no-tokenizer", lambda folder: (folder / "tokenizer.json").unlink()),
         "has no tokenizer.json: export the model again with mcsd-export format=onnx"),
        (damaged("cut-manifest", lambda folder: cut(folder / MANIFEST_FILE)),
         "export.json is not a readable export manifest (JSONDecodeError: "),
        (damaged("other-step", lambda folder: shutil.copy(whole["transformer"] / "step.onnx", folder / "step.onnx")),
         "prefill.onnx and step.onnx are not the graphs of one export ("),
    ]
    for folder, message in cases:
        result = run_here("mcsd-generate", f"ckpt={folder}", "runtime=onnx", "prompt=the king", "max_new_tokens=4")
        errors = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(errors) == 1 and message in errors[0], result.stderr[-2000:]
        assert errors[0].startswith(f"mcsd-generate: error: ckpt={folder}: ") and result.stdout == ""
