"""mcsd-bench: a tiny grid end to end, OOM points recorded, figures drawn."""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from helpers import ROOT
from helpers.models import tiny_config, tiny_model
from helpers.runs import TINY_INFERENCE, command, run_bench, run_here
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import mcsd
from mcsd.bench import decoding, runner, training_step
from mcsd.bench.load import SPREAD_LIMIT, other_cores, read_clock, sample_other_cores, spread
from mcsd.bench.decoding import kv_positions_read
from mcsd.checkpoint.model_source import resolve
from mcsd.checkpoint.bench_results import COLUMNS, LABELS
from mcsd.bench.runner import run_point
from mcsd.errors import MCSDError
from mcsd.checkpoint.wandb_run import find_wandb_runs, read_wandb_run
from mcsd.runtime import git_commit
from mcsd.models import registry
from mcsd.models.modeling import CausalLM
from mcsd.models.cuda_graphs import StaticStep
from mcsd.plots.cost import HOLLOW_NOTE, _title, model_label, plot_inference, plot_train



# Bytes of one sequence's decoding state after ``tokens`` tokens, per architecture (fp32):
STATE_BYTES = {
    "mcsd": lambda node, tokens: 2 * node.num_layers * node.hidden_size * 4,  # two section states
    "transformer": lambda node, tokens: 2 * node.num_layers * node.hidden_size * tokens * 4,  # keys and values
    "retnet": lambda node, tokens: node.num_layers * node.hidden_size * node.value_expansion  # H x dk x dv
    * node.hidden_size // node.num_channels * 4,
    "rwkv4": lambda node, tokens: 5 * node.num_layers * node.hidden_size * 4,  # (x, a, b, p) + channel mix's x
    "wonderful_matrices": lambda node, tokens: sum(  # attention layers: keys, values (and key biases)
        (2 * node.hidden_size + node.num_channels * node.dynamic_mask) * tokens * 4
        if node.attention_every and index % node.attention_every == node.attention_every - 1
        else node.state_size * node.ssd_expand * node.hidden_size * 4  # SSD: [H, N, P]
        for index in range(node.num_layers)),
    "gla": lambda node, tokens: node.num_layers * node.num_channels * 4  # H x dk x dv per layer
    * int(node.key_expansion * node.hidden_size // node.num_channels)
    * int(node.value_expansion * node.hidden_size // node.num_channels),
    "gated_deltanet": lambda node, tokens: node.num_layers * 4 * (  # [H, dk, dv] and the convolution's last inputs
        node.hidden_size * int(node.value_expansion * node.hidden_size // node.num_channels)
        + (node.conv_size - 1) * int((2 + node.value_expansion) * node.hidden_size)),
    "mamba2": lambda node, tokens: node.num_layers * 4 * (  # the SSD's [H, N, P] and the convolution's last inputs
        node.state_size * node.expand * node.hidden_size
        + (node.conv_size - 1) * (node.expand * node.hidden_size + 2 * node.state_size)),
}


@pytest.mark.slow
def test_inference_grid_writes_every_point_and_its_figures(tmp_path: Path) -> None:
    csv_path = run_bench(tmp_path, *TINY_INFERENCE, "isolate=false")
    frame = pd.read_csv(csv_path)
    names = registry.architectures()
    assert len(frame) == len(names) * 2 * 2  # lengths x batch sizes x models, in grid order: every model side by side
    assert list(frame["model"]) == names * 4 and frame["model"].equals(frame["arch"])
    assert list(frame["gen_len"]) == [4] * 2 * len(names) + [8] * 2 * len(names)
    assert list(frame["batch"]) == ([1] * len(names) + [2] * len(names)) * 2
    assert list(frame["variant"]) == [next(iter(registry.get(name).variants)) for name in names] * 4
    assert (frame["status"] == "ok").all()
    assert (frame["tokens_per_s"] == frame["batch"] * frame["gen_len"] / frame["latency_s"]).all()
    assert (frame["decode_s_per_token"] * frame["gen_len"] < frame["latency_s"]).all()
    assert (frame["peak_mem_minus_weights_bytes"] == frame["peak_mem_bytes"] - frame["weights_bytes"]).all()
    assert frame.groupby("model")["params"].nunique().eq(1).all()
    # A sequence's decoding state after 16 + gen_len tokens, fp32: every architecture's own formula.
    assert set(STATE_BYTES) == set(names)
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        nodes = {name: compose("build", overrides=[f"model={name}", "size=tiny"]).model for name in names}
    for name, rows in frame.groupby("model"):
        expected = [STATE_BYTES[name](nodes[name], 16 + gen_len) for gen_len in rows["gen_len"]]
        assert list(rows["state_bytes_per_sequence"]) == expected, name
        # What an average step reads of it: a KV cache's 16 + (gen_len + 1) / 2 positions, the rest whole.
        read = [STATE_BYTES[name](nodes[name], 16 + (gen_len + 1) / 2) for gen_len in rows["gen_len"]]
        assert list(rows["step_state_bytes_per_sequence"]) == pytest.approx(read, rel=1e-12), name
        if name == "transformer":
            assert rows["step_state_bytes_per_sequence"].iloc[0] < rows["state_bytes_per_sequence"].iloc[0]
    assert set(frame["dtype"]) == {"float32"} and frame["torch"].iloc[0] == torch.__version__
    head = json.loads((tmp_path / "results.json").read_text())["header"]
    assert {"device", "dtype", "torch", "git_commit"} <= set(head)
    # The bandwidth limit: one step's time over the time to read the weights it uses and the states
    # of its batch once, at the bandwidth measured right before each point (each its own measurement).
    assert (frame["read_bandwidth_bytes_per_s"] > 1e8).all() and frame["read_bandwidth_bytes_per_s"].nunique() > 1
    for name, rows in frame.groupby("model"):
        model = mcsd.build_model(nodes[name])
        read = sum(p.numel() for p in model.parameters()) - (0 if model.config.tie_embeddings else 512 * 64)
        assert (rows["step_weight_bytes"] == 4 * read).all(), name
    assert (frame["step_read_bytes"] == frame["step_weight_bytes"]
            + frame["batch"] * frame["step_state_bytes_per_sequence"]).all()
    assert (frame["limit_ratio"] == frame["decode_s_per_token"]
            / (frame["step_read_bytes"] / frame["read_bandwidth_bytes_per_s"])).all()
    figures = plot_inference(csv_path)
    assert sorted(path.name for path in figures) == sorted(
        f"{name}.{suffix}" for name in ["fig5_memory_vs_length", "fig6_latency_vs_batch", "fig7_throughput_vs_length",
                                        "fig8_throughput_vs_batch", "decode_limit_ratio"]
        for suffix in ("png", "pdf"))
    assert all(path.stat().st_size > 5000 for path in figures)


@pytest.mark.slow
def test_compiled_decoding_is_benchmarked_after_its_compilation(tmp_path: Path) -> None:
    """``compile=true``: the points decode through the compiled step (compiled in the warm-up,
    which runs even when ``inference.warmup=0``) and the results say so. (The bench's handling of a
    compiled point, traced without inductor: inductor's step is tests/models/test_generate.py's.)"""
    csv_path = run_bench(tmp_path, *TINY_INFERENCE, "inference.warmup=0", "inference.batch_sizes=[2]",
                         "models=[mcsd]", "compile=true", "isolate=false")
    frame = pd.read_csv(csv_path)
    assert list(frame["status"]) == ["ok", "ok"] and frame["compile"].all() and frame["compiled"].all()
    assert json.loads((tmp_path / "results.json").read_text())["header"]["compile"] is True
    assert (frame["graphs_compiled_timed"] == 0).all()  # every timed step ran what the warm-up compiled


@pytest.mark.parametrize("arch", ["mcsd", "transformer"])
def test_decoding_replayed_from_recordings_is_timed_after_every_recording(
        arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``cuda_graphs=true`` (its recordings here replayed by calls, as the CPU runs the static step:
    :mod:`mcsd.models.cuda_graphs`): the warm-up decodes the whole length, recording every
    KV-cache bucket (a prompt of 3 and 8 new tokens: buckets 4, 8 and the prefill's 11), so the
    timed sequences, each read into the step's own buffers, record none."""
    from mcsd.models.modeling import CausalLM
    from mcsd.models.modules.state import Decoding
    from mcsd.models.cuda_graphs import StaticStep

    steps = []

    def static_decoding(model: CausalLM, compile: bool = False, cuda_graphs: bool = False) -> Decoding:
        assert cuda_graphs
        steps.append(StaticStep(model, compile=compile, record="call", min_capacity=4))
        return Decoding(steps[-1].prefill, steps[-1])

    monkeypatch.setattr(CausalLM, "decoding", static_decoding)
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        node = OmegaConf.to_container(compose("build", overrides=[f"model={arch}", "size=tiny"]).model, resolve=True)
    result = decoding.inference_point(node, batch_size=2, prompt_len=3, gen_len=8, repeats=2, warmup=0, device="cpu",
                                     dtype="float32", seed=0, cuda_graphs=True)
    assert (result["cuda_graphs"], result["graphs_recorded_timed"]) == (True, 0)
    assert (steps[0].recorded, steps[0].replayed) == ((3 if arch == "transformer" else 1), 3 * 8)


@pytest.mark.slow
def test_a_failing_point_is_a_row_of_its_own_and_the_grid_goes_on(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Failures injected into the second and third points: a GPU library's allocation failure is
    ``oom``, any other error is ``error`` with its one-line reason; the points after them are
    measured; results.json holds every point measured before each point starts; a failed point's
    tensors, held in a reference cycle (the collector's work, run on the point's objects alone), are
    freed before the next point, and the collector's freeze is undone."""
    real = decoding.inference_point
    started, held = [], []

    def failing(**arguments: object) -> dict[str, object]:
        point = len(started)
        started.append(point)
        written = json.loads((tmp_path / "results.json").read_text())["points"] if point else []
        assert len(written) == point
        assert all(reference() is None for reference in held)  # the failed point's memory is gone
        if point == 1:
            tensors = torch.ones(2**20)
            held.append(weakref.ref(tensors))
            cycle = [tensors]
            cycle.append(cycle)
            del tensors
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
        if point == 2:
            raise ValueError("this model cannot decode\nsecond line of the message")
        return real(**arguments)

    monkeypatch.setitem(runner.POINTS, "inference", failing)
    csv_path = run_bench(tmp_path, *TINY_INFERENCE, "inference.batch_sizes=[1]", "inference.gen_lengths=[4]",
                         "models=[mcsd,transformer,retnet,rwkv4]", "isolate=false")
    frame = pd.read_csv(csv_path)
    assert list(frame["status"]) == ["ok", "oom", "error", "ok"] and len(started) == 4
    assert frame["reason"][1].startswith("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED")
    assert frame["reason"][2] == "ValueError: this model cannot decode"
    assert pd.isna(frame["reason"][0]) and frame["tokens_per_s"][3] > 0
    assert json.loads((tmp_path / "results.json").read_text())["header"]["complete"] is True
    assert gc.get_freeze_count() == 0


@pytest.mark.slow
def test_a_point_that_fails_in_its_own_process_is_an_error_row() -> None:
    """An isolated point whose measurement raises (here a model node that cannot be built) comes
    back as a row with its reason, not as an exception that ends the grid."""
    arguments = {"model_cfg": tiny_config("mcsd", hidden_size=25), "batch_size": 1, "prompt_len": 4, "gen_len": 2,
                 "repeats": 1, "warmup": 0, "device": "cpu", "dtype": "float32", "seed": 0}
    result = run_point("inference", arguments, isolate=True, memory_limit_mb=None)
    assert result["status"] == "error"
    assert result["reason"].startswith("ConfigError: model.hidden_size=25 is not divisible by model.num_channels=3")


def test_isolated_points_import_the_code_their_bench_runs(tmp_path: Path) -> None:
    """A bench started from a folder that holds another ``mcsd`` (a checkout, as a before/after run
    starts from one while its other side is on ``PYTHONPATH``) measures its points with the code it
    imported itself: Python 3.11's fork server would put that folder first on its path."""
    shadow = tmp_path / "checkout"
    (shadow / "mcsd").mkdir(parents=True)
    (shadow / "mcsd" / "__init__.py").write_text("")
    script = tmp_path / "where.py"
    script.write_text(
        "import importlib.util\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "from mcsd.bench import runner\n"
        "if __name__ == '__main__':\n"
        "    with ProcessPoolExecutor(max_workers=1, mp_context=runner.point_processes()) as pool:\n"
        "        with runner.parents_import_path():\n"
        "            pool.submit(int).result()\n"
        "        print(pool.submit(importlib.util.find_spec, 'mcsd').result().origin)\n"
        "    print(importlib.util.find_spec('mcsd').origin)\n")
    environment = {**os.environ, "PYTHONPATH": str(Path(mcsd.__file__).parents[1])}
    lines = subprocess.run([sys.executable, str(script)], cwd=shadow, env=environment, capture_output=True,
                           text=True, check=True).stdout.split()
    assert lines[0] == lines[1] == mcsd.__file__


@pytest.mark.slow
def test_compiled_points_compile_each_model_of_their_own(tmp_path: Path) -> None:
    """In one process, every compiled point compiles its own model's step: with dynamo's recompile
    limit at 2 (a point compiles one or two graphs), models that shared one step function would hit
    it by the third point (a point that hits it is an error, never a silent eager run); each row
    says it ran compiled. Three one-layer MCSD models, each a model node of its own, traced without
    inductor (dynamo's guards and recompile limit are what this checks)."""
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        node = resolve("mcsd", "tiny").node
    models = [tmp_path / f"mcsd_{index}.yaml" for index in range(3)]
    for model in models:
        model.write_text(yaml.safe_dump({"model": {**node, "num_layers": 1}}))
    with torch._dynamo.config.patch(recompile_limit=2):
        csv_path = run_bench(tmp_path, *TINY_INFERENCE, "inference.batch_sizes=[2]", "inference.gen_lengths=[4]",
                             f"models=[{','.join(map(str, models))}]", "compile=true", "isolate=false")
    frame = pd.read_csv(csv_path)
    assert list(frame["status"]) == ["ok"] * 3 and frame["compiled"].all()
    assert all(point["compiled"] is True for point in json.loads((tmp_path / "results.json").read_text())["points"])


@pytest.mark.slow
def test_every_architecture_benches_cast_to_16_bits(tmp_path: Path) -> None:
    """``dtype=bfloat16``: every architecture's model, built in that dtype, decodes (the weights'
    bytes are 2 a parameter); ``dtype=float16``: every architecture trains under autocast with fp32
    weights, as mcsd-train trains; each row names its precision as Lightning does (``bf16-true``,
    ``16-mixed``). One dtype a mode: the other runs the same code (every variant decodes cast to
    each dtype in tests/models/test_precision.py); both modes in both dtypes took 48 s."""
    csv_path = run_bench(tmp_path / "inference", *TINY_INFERENCE, "inference.batch_sizes=[2]", "inference.gen_lengths=[4]",
                         "dtype=bfloat16", "isolate=false")
    frame = pd.read_csv(csv_path)
    assert list(frame["model"]) == registry.architectures() and (frame["status"] == "ok").all()
    assert (frame["weights_bytes"] == 2 * frame["params"]).all() and not frame["compiled"].any()
    assert set(frame["precision"]) == {"bf16-true"}
    csv_path = run_bench(tmp_path / "train", "mode=train", "model_size=tiny", "train.seq_lens=[32]", "train.repeats=1",
                         "train.peak_matmul_size=64",
                         "train.warmup=0", "train.forms=[training]", "dtype=float16", "isolate=false")
    frame = pd.read_csv(csv_path)
    assert list(frame["model"]) == registry.architectures() and (frame["status"] == "ok").all()
    assert set(frame["precision"]) == {"16-mixed"}
    assert (frame["weights_bytes"] == 4 * frame["params"]).all()  # fp32 weights under autocast


@pytest.mark.slow
def test_an_isolated_point_reports_its_own_peak_memory(tmp_path: Path) -> None:
    """A point's fresh process reports its own peak memory, not that of the process that
    started it: after this process has held 1 GiB, a tiny model's points still peak far below."""
    held = torch.ones(2**28)  # 1 GiB, touched
    del held
    csv_path = run_bench(tmp_path, *TINY_INFERENCE, "inference.batch_sizes=[1]", "inference.gen_lengths=[4]",
                         "models=[mcsd]", "isolate=true")
    peak = pd.read_csv(csv_path)["peak_mem_bytes"].iloc[0]
    assert 50 * 2**20 < peak < 2**30


@pytest.mark.slow
def test_isolated_points_record_oom_under_a_memory_cap(tmp_path: Path) -> None:
    """With 450 MiB of room (of address space: it counts reserved memory too) a batch of 64
    decodes 2048 tokens with MCSD (fixed state), while the Transformer's KV cache (570 MiB)
    does not fit: recorded, not raised."""
    csv_path = run_bench(tmp_path, "model_size=small", "models=[mcsd,transformer]", "inference.batch_sizes=[64]",
                         "inference.gen_lengths=[2048]", "inference.repeats=1", "inference.warmup=1", "memory_limit_mb=450")
    frame = pd.read_csv(csv_path).set_index("model")
    assert frame.loc["mcsd", "status"] == "ok" and frame.loc["transformer", "status"] == "oom"
    assert pd.isna(frame.loc["transformer", "latency_s"])
    assert frame.loc["mcsd", "peak_mem_bytes"] > 0  # peak resident memory of that point's own process
    figures = plot_inference(csv_path, tmp_path / "figures")
    assert len(figures) == 10


TINY_SIZE = yaml.safe_load((ROOT / "conf" / "size" / "tiny.yaml").read_text())["model"]


@pytest.mark.slow
def test_training_grid_and_its_figure(tmp_path: Path) -> None:
    csv_path = run_bench(tmp_path, "mode=train", "model_size=tiny", "train.seq_lens=[32,64]", "train.repeats=1",
                         "train.peak_matmul_size=256",
                         "train.warmup=1", "isolate=false")
    frame = pd.read_csv(csv_path)
    # At each length, each architecture's parallel form, then its training form.
    assert list(zip(frame["seq_len"], frame["model"], frame["form"])) == [
        (seq_len, name, form) for seq_len in (32, 64) for name in registry.architectures()
        for form in dict.fromkeys(["parallel", registry.get(name).train_form])]
    assert (frame["tokens_per_s"] == frame["seq_len"] / frame["step_s"]).all()
    # MFU against the matmul peak measured right before each point (each its own measurement).
    assert (frame["matmul_peak_flops"] > 1e8).all() and frame["matmul_peak_flops"].nunique() > 1
    # MFU from the model FLOPs; FlopCounterMode's count beside them (for the Transformer's parallel form: the
    # causal attention's model FLOPs and the masked half, 6 L d N (N - 1) a row, that the counter counts too).
    assert (frame["peak_flops"] == frame["matmul_peak_flops"]).all() and (frame["peak_source"] == "measured matmul peak").all()
    assert (frame["mfu"] == frame["model_flops"] / frame["step_s"] / frame["peak_flops"]).all()
    attention = frame[(frame["model"] == "transformer") & (frame["form"] == "parallel")]
    masked = 6 * TINY_SIZE["num_layers"] * TINY_SIZE["hidden_size"] * attention["seq_len"] * (attention["seq_len"] - 1)
    assert len(attention) == 2 and (attention["counted_flops"] == attention["model_flops"] + masked).all()
    assert (frame["model_flops"] > 6 * (frame["params"] - 512 * 64) * frame["seq_len"] * 0.9).all()
    (figure_png, figure_pdf) = plot_train(csv_path)
    assert figure_png.stat().st_size > 5000 and figure_pdf.is_file()
    with pytest.raises(MCSDError, match="holds training results: use mcsd-plot train"):
        plot_inference(csv_path)


def test_compiled_training_is_benchmarked_after_its_compilation(tmp_path: Path) -> None:
    """``mode=train compile=true``: the points step through the compiled model + loss (compiled in
    the warm-up, which runs even when ``train.warmup=0``) and the results say so. One layer of
    MCSD's tiny model, as a model node of its own (compiling takes time per layer), traced without
    inductor (inductor's loss: tests/training/test_train.py)."""
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        node = resolve("mcsd", "tiny").node
    one_layer = tmp_path / "one_layer.yaml"
    one_layer.write_text(yaml.safe_dump({"model": {**node, "num_layers": 1}}))
    csv_path = run_bench(tmp_path, "mode=train", "train.seq_lens=[32]", "train.repeats=2", "train.warmup=0",
                         "train.peak_matmul_size=256",
                         f"models=[{one_layer}]", "train.forms=[training]", "compile=true", "isolate=false")
    frame = pd.read_csv(csv_path)
    assert list(frame["form"]) == ["chunk"]  # [training]: the architecture's training form
    assert list(frame["status"]) == ["ok"] and frame["compile"].all()
    # A compilation inside the timed steps would take seconds: these take milliseconds; the
    # first step, compiling, is recorded apart.
    assert (frame["step_s"] < 0.5).all() and (frame["first_step_s"] > 10 * frame["step_s"]).all()


def test_kernels_and_documents_are_grid_axes_recorded_per_row_and_drawn_apart(tmp_path: Path) -> None:
    """``kernels=[torch,auto]`` (auto is torch on a CPU): each model whose mixers run an op is
    measured with each, side by side at every point, the Transformer once; ``train.documents=
    [joined,apart]``: every point with its documents joined and apart. Each row says its backend
    and documents, and the figures draw a series for each."""
    csv_path = run_bench(tmp_path, "mode=train", "model_size=tiny", "models=[mcsd,transformer]", "kernels=[torch,auto]",
                         "train.documents=[joined,apart]", "train.document_tokens=8",
                         "train.seq_lens=[32]", "train.forms=[training]", "train.repeats=1", "train.warmup=0",
                         "train.peak_matmul_size=256", "isolate=false")
    frame = pd.read_csv(csv_path)
    assert list(zip(frame["model"], frame["kernels"], frame["documents"])) == [
        ("mcsd", "torch", "joined"), ("mcsd", "torch", "apart"), ("mcsd", "auto", "joined"), ("mcsd", "auto", "apart"),
        ("transformer", "torch", "joined"), ("transformer", "torch", "apart")]
    assert (frame["status"] == "ok").all()
    from mcsd.plots.cost import read_results

    labels = [model_label(arch, model) for arch, model in zip(*[read_results(csv_path)[1][key] for key in ("arch", "model")])]
    assert labels == [f"MCSD, {kernels} kernels, documents {documents}" for kernels in ("torch", "auto")
                      for documents in ("joined", "apart")] + ["Transformer, documents joined", "Transformer, documents apart"]
    assert plot_train(csv_path)[0].stat().st_size > 5000


def test_a_point_with_documents_apart_trains_on_documents_that_start_where_the_positions_say(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``documents=apart``: the loss gets each token's position in its document, documents of
    exponential lengths of the asked mean, the same from the same seed; joined, none."""
    positions = training_step.document_positions(4, 2000, 16, torch.Generator().manual_seed(0))
    assert torch.equal(positions, training_step.document_positions(4, 2000, 16, torch.Generator().manual_seed(0)))
    assert (positions[:, 0] == 0).all()
    stepped = positions[:, 1:] == positions[:, :-1] + 1  # within a document: one more; else a new one at 0
    assert (stepped | (positions[:, 1:] == 0)).all()
    starts = int((positions == 0).sum())
    assert 4 * 2000 / 16 * 0.8 < starts < 4 * 2000 / 16 * 1.2  # the mean length, 16 tokens, within 20%
    seen = []
    loss = CausalLM.loss

    def recorded(self: CausalLM, input_ids: torch.Tensor, *args: object, **kwargs: object) -> object:
        if input_ids.device.type != "meta":  # not the FLOP count's run on the meta device
            seen.append(kwargs.get("position_ids"))
        return loss(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(CausalLM, "loss", recorded)
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        node = resolve("mcsd", "tiny").node
    for documents in ("joined", "apart"):
        training_step.train_point(node, "chunk", 2, 32, repeats=1, warmup=0, device="cpu", dtype="float32", seed=0,
                            documents=documents, document_tokens=8)
    assert seen[0] is None and seen[-1].shape == (2, 32) and int((seen[-1] == 0).sum()) > 2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [(["mode=serve"], "mode='serve' is unknown"),
     (["device=cuda"], "device=cuda but no GPU is visible: use device=cpu"),
     (["cuda_graphs=true"], "cuda_graphs=true replays CUDA graphs, which device=cpu has not: set cuda_graphs=false"),
     (["dtype=int8"], "dtype='int8' is unknown"),
     (["models=[mcsd,retnet9]"], "models: 'retnet9' is neither a registered architecture \\(mcsd, transformer"),
     (["mode=train", "train.forms=[sparse]"], "train.forms: mcsd has no form 'sparse'"),
     (["mode=train", "train.batch_size=null"], "train.batch_size=null and train.tokens_per_step=null leave no training"),
     (["busy_machine=sometimes"], "busy_machine='sometimes' is unknown: use refuse, wait, measure"),
     (["kernels=[]"], r"kernels=\[\] must be a list of some of auto, torch, fla, e.g. kernels=\[torch,fla\]"),
     (["kernels=fla"], "kernels=fla must be a list of some of auto, torch, fla"),
     (["kernels=[torch,fla]"], "model.kernels=fla runs Triton kernels on a CUDA GPU, and this model runs on cpu"),
     (["mode=train", "train.documents=[split]"], r"train.documents=\['split'\] must be a list of some of joined, apart"),
     (["mode=train", "train.document_tokens=0"], "train.document_tokens=0 must be a whole number of at least 1")],
)
def test_bad_bench_settings_fail_in_one_line(tmp_path: Path, overrides: list[str], message: str) -> None:
    with pytest.raises(MCSDError, match=message):
        run_bench(tmp_path, *overrides)


@pytest.mark.slow
def test_ctrl_c_stops_after_the_point_under_way_and_keeps_the_points_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the second point is measured: that point finishes, no other starts; the
    results hold the two points (complete=false, the points planned), which equal the first two
    points of the uninterrupted grid (all but the timings); mcsd-plot draws them; exit 130, and the
    W&B run (offline) holds the two points and ends 130 too."""
    grid = [*TINY_INFERENCE, "inference.batch_sizes=[1]", "models=[mcsd,transformer]", "isolate=false"]
    measured = []
    point = decoding.inference_point

    def point_then_ctrl_c(**arguments):
        measured.append(arguments["gen_len"])
        if len(measured) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # arrives mid-point, as a Ctrl-C would
        return point(**arguments)

    monkeypatch.setitem(runner.POINTS, "inference", point_then_ctrl_c)
    try:
        with pytest.raises(SystemExit) as stopped:
            run_bench(tmp_path / "stopped", *grid, "wandb.enabled=true")
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the app leaves Ctrl-C ignored as it exits
    assert stopped.value.code == 130 and measured == [4, 4]  # 4 points planned, the third never started
    head = json.loads((tmp_path / "stopped" / "results.json").read_text())["header"]
    assert head["complete"] is False and head["points_planned"] == 4 and head["stopped_by"] == "Ctrl-C"
    kept = pd.read_csv(tmp_path / "stopped" / "results.csv")
    monkeypatch.setitem(runner.POINTS, "inference", point)
    whole = pd.read_csv(run_bench(tmp_path / "whole", *grid))
    assert len(kept) == 2 and (~kept["complete"]).all() and whole["complete"].all()
    timings = ["prefill_s", "decode_s_per_token", "latency_s", "tokens_per_s", "peak_mem_bytes",
               "peak_mem_minus_weights_bytes", "read_bandwidth_bytes_per_s", "limit_ratio", "complete",
               "points_planned", "git_commit", "decode_s_per_token_min", "decode_s_per_token_max", "unsteady",
               "other_cores", "shared", "point_s", "measured_at", "stopped_by"]
    pd.testing.assert_frame_equal(kept.drop(columns=timings), whole.head(2).drop(columns=timings))
    figures = plot_inference(tmp_path / "stopped" / "results.csv")
    assert figures and all(path.stat().st_size > 0 for path in figures)
    (wandb_file,) = find_wandb_runs(tmp_path / "stopped")  # its W&B run keeps the two points and ends as the process
    logged = read_wandb_run(wandb_file)
    assert logged.exit_code == 130 and logged.group == "bench/stopped" and logged.summary["points_measured"] == 2
    assert sorted(row["tokens_per_s"] for row in logged.history if "tokens_per_s" in row) == sorted(kept["tokens_per_s"])


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_in_one_line(tmp_path: Path) -> None:
    """Ctrl-C as a terminal sends it (to the process group: the points' own processes too),
    twice: the point under way is dropped at once, the point finished is kept, one line says
    so, exit status 130, no traceback from mcsd-bench or the point's process."""
    arguments = [command("mcsd-bench"), *TINY_INFERENCE, "inference.batch_sizes=[1]",
                 "models=[mcsd,transformer]", "wandb.enabled=false"]
    bench_process = subprocess.Popen(arguments, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    for line in bench_process.stdout:
        if "tokens/s" in line:  # the first point is measured
            break
    os.killpg(bench_process.pid, signal.SIGINT)
    time.sleep(1.0)
    os.killpg(bench_process.pid, signal.SIGINT)
    stdout, stderr = bench_process.communicate(timeout=300)
    errors = [line for line in stderr.splitlines() if line.startswith("mcsd-bench:")]
    assert bench_process.returncode == 130 and len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert "kept the 1 of 4 points measured in" in errors[0]
    (run,) = (tmp_path / "logs" / "bench" / "runs").iterdir()
    kept = pd.read_csv(run / "results.csv")
    assert len(kept) == 1 and list(kept["gen_len"]) == [4] and list(kept["status"]) == ["ok"]


@pytest.mark.slow
def test_cli_runs_under_paths_log_dir_and_plot_cli_names_a_missing_file(tmp_path: Path) -> None:
    result = run_here("mcsd-bench", *TINY_INFERENCE, "inference.batch_sizes=[1]", "models=[mcsd]",
                     "wandb.enabled=true", "paths.log_dir=elsewhere", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert [path.name for path in tmp_path.iterdir()] == ["elsewhere"]  # everything it wrote is there
    (run,) = (tmp_path / "elsewhere" / "bench" / "runs").iterdir()
    assert len(pd.read_csv(run / "results.csv")) == 2
    (wandb_file,) = find_wandb_runs(run)  # an offline W&B run: a row and a summary number per point, then the table
    logged = read_wandb_run(wandb_file)
    assert (logged.group, logged.job_type, logged.exit_code) == (f"bench/{run.name}", "bench", 0)
    speeds = pd.read_csv(run / "results.csv")["tokens_per_s"]
    assert sorted(row["tokens_per_s"] for row in logged.history if "tokens_per_s" in row) == sorted(speeds)
    assert sorted(value for key, value in logged.summary.items() if key.startswith("tokens_per_s/")) == sorted(speeds)
    assert (logged.summary["points_measured"], logged.summary["complete"]) == (2, True)
    assert logged.config["git_commit"] == git_commit() and logged.config["trained_runs"] == []
    missing = run_here("mcsd-plot", "inference", "source=nothing.csv", cwd=tmp_path)
    assert missing.returncode == 2 and "mcsd-plot: error: nothing.csv does not exist" in missing.stderr


def test_a_saved_model_benches_beside_an_architecture(tmp_path: Path) -> None:
    """``models`` takes a saved model (here a model folder) beside a registered architecture."""
    model = mcsd.build_model(tiny_config("transformer", vocab_size=512, hidden_size=64, num_channels=4))
    saved = mcsd.save(model, tmp_path / "run" / "model")
    csv_path = run_bench(tmp_path / "out", *TINY_INFERENCE, "inference.batch_sizes=[1]", "inference.gen_lengths=[4]",
                         "isolate=false", f"models=[mcsd,{saved.parent}]")
    frame = pd.read_csv(csv_path)
    assert list(frame["arch"]) == ["mcsd", "transformer"] and list(frame["size"]) == ["tiny", "saved"]
    assert frame["params"].iloc[1] == sum(p.numel() for p in model.parameters())
    assert model_label("transformer", frame["model"].iloc[1]) == "Transformer (run)"


def test_dtype_auto_benches_in_the_dtype_every_command_chooses(tmp_path: Path) -> None:
    """``dtype=auto`` means what it means to mcsd-generate, mcsd-eval and mcsd-probe (fp32 on a CPU):
    the header and every row record the dtype it chose."""
    csv_path = run_bench(tmp_path, *TINY_INFERENCE, "models=[mcsd]", "inference.batch_sizes=[1]",
                         "inference.gen_lengths=[4]", "isolate=false", "dtype=auto")
    assert list(pd.read_csv(csv_path)[["dtype", "precision"]].itertuples(index=False, name=None)) == [("float32", "32-true")]
    assert json.loads((tmp_path / "results.json").read_text())["header"]["dtype"] == "float32"


def test_a_bench_point_opens_its_checkpoint_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``.ckpt`` entry is read once to plan the grid (its architecture and variant) and once by
    each point (config and weights from the same read), not once per part."""
    from mcsd.checkpoint import saved_model

    model = mcsd.build_model(tiny_config("mcsd", vocab_size=512, hidden_size=64, num_channels=4))
    checkpoint = tmp_path / "run" / "checkpoints" / "step-000001.ckpt"
    checkpoint.parent.mkdir(parents=True)
    torch.save({"hyper_parameters": {"model": model.config.to_portable_dict()},
                "state_dict": {f"model.{name}": value for name, value in model.state_dict().items()}}, checkpoint)
    reads: list[Path] = []
    real = saved_model.read_checkpoint
    monkeypatch.setattr(saved_model, "read_checkpoint", lambda path: reads.append(Path(path)) or real(path))
    csv_path = run_bench(tmp_path / "out", *TINY_INFERENCE, "inference.batch_sizes=[1]", "inference.gen_lengths=[2,4]",
                         "isolate=false", f"models=[{checkpoint}]")
    frame = pd.read_csv(csv_path)
    assert list(frame["status"]) == ["ok", "ok"] and list(frame["arch"]) == ["mcsd", "mcsd"]
    assert frame["params"].iloc[0] == sum(p.numel() for p in model.parameters())
    assert reads == [checkpoint] * 3  # the plan, then each of the two points


def test_a_runs_config_benches_as_its_model_with_random_weights(tmp_path: Path) -> None:
    """``models`` takes a run's logged config (its ``model`` node, as in ``hparams.yaml``): the
    run's architecture and variant with seeded random weights, costing what the registry's own
    build of that variant costs."""
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        node = OmegaConf.to_container(compose("build", overrides=["model=mcsd", "size=tiny", "ablation=slope_only"]).model,
                                      resolve=True)
    logged = tmp_path / "run" / "hparams.yaml"
    logged.parent.mkdir()
    logged.write_text(yaml.safe_dump({"seed": 0, "model": node}))
    csv_path = run_bench(tmp_path / "out", *TINY_INFERENCE, "inference.batch_sizes=[1]", "inference.gen_lengths=[4]",
                         "isolate=false", "model_variant=slope_only", f"models=[mcsd,{logged}]")
    frame = pd.read_csv(csv_path)
    assert list(frame["variant"]) == ["slope_only", "slope_only"] and list(frame["size"]) == ["tiny", "config"]
    assert frame["params"].nunique() == 1 and frame["params"].iloc[0] == sum(
        p.numel() for p in mcsd.build_model(node).parameters())
    assert frame["state_bytes_per_sequence"].nunique() == 1
    empty = tmp_path / "empty.yaml"
    empty.write_text("seed: 0\n")
    with pytest.raises(MCSDError, match="empty.yaml holds no model node"):
        run_bench(tmp_path / "bad", *TINY_INFERENCE, f"models=[{empty}]")


@pytest.mark.slow
def test_experiment_script_writes_a_trial_unless_asked_to_replace(tmp_path: Path) -> None:
    """experiments/*/run.sh never overwrites the committed results silently: a run writes trial/
    (the real commands), one with --replace the committed folder (commands that record their
    arguments stand in for them there: the folder is what differs)."""
    script = tmp_path / "fig" / "run.sh"
    script.parent.mkdir()
    shutil.copy(ROOT / "experiments" / "fig5-8_inference" / "run.sh", script)
    committed = tmp_path / "fig" / "cpu_quick" / "results.csv"
    committed.parent.mkdir()
    committed.write_text("committed\n")
    tiny = [*TINY_INFERENCE, "inference.batch_sizes=[1]", "inference.gen_lengths=[4]", "models=[mcsd]",
            "isolate=false", "wandb.enabled=false"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "WANDB_MODE": "offline"}
    result = subprocess.run(["bash", str(script), "cpu_quick", *tiny], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    trial = tmp_path / "fig" / "trial" / "cpu_quick"
    assert (trial / "results.csv").is_file() and (trial / "fig5_memory_vs_length.png").is_file()
    assert committed.read_text() == "committed\n"
    stand_ins, calls = tmp_path / "bin", tmp_path / "calls.txt"
    stand_ins.mkdir()
    for name in ("mcsd-bench", "mcsd-plot"):
        (stand_ins / name).write_text(f'#!/bin/sh\necho "$(pwd) {name} $*" >> {calls}\n')
        (stand_ins / name).chmod(0o755)
    result = subprocess.run(["bash", str(script), "--replace", "cpu_quick", "models=[mcsd]"], cwd=tmp_path,
                            env={**env, "PATH": f"{stand_ins}:{os.environ['PATH']}"}, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert calls.read_text().splitlines() == [
        f"{script.parent} mcsd-bench bench=cpu_quick output_dir=./cpu_quick models=[mcsd]",
        f"{script.parent} mcsd-plot experiment source=./cpu_quick name=fig5-8_inference"]


@pytest.mark.slow
def test_tokens_per_step_adds_a_realistic_checkpointed_step_beside_each_point(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``train.tokens_per_step``: beside each ``batch_size`` point, one of ``tokens_per_step // seq_len``
    sequences, run with activation checkpointing (each layer's forward through ``checkpoint``)."""
    from mcsd.models import modeling as common

    checkpointed = []

    def counting_checkpoint(*args: object, **kwargs: object) -> object:
        checkpointed.append(1)
        return real_checkpoint(*args, **kwargs)

    real_checkpoint = common.checkpoint
    monkeypatch.setattr(common, "checkpoint", counting_checkpoint)
    csv_path = run_bench(tmp_path, "mode=train", "model_size=tiny", "models=[mcsd]", "train.forms=[training]",
                         "train.seq_lens=[16,32]", "train.tokens_per_step=64", "train.repeats=1", "train.warmup=0",
                         "train.peak_matmul_size=64", "isolate=false")
    frame = pd.read_csv(csv_path)
    assert list(zip(frame["batch"], frame["seq_len"], frame["activation_checkpointing"])) == [
        (1, 16, False), (4, 16, True), (1, 32, False), (2, 32, True)]
    assert (frame["status"] == "ok").all() and (frame["tokens_per_s"] == frame["batch"] * frame["seq_len"]
                                                / frame["step_s"]).all()
    assert len(checkpointed) == 2 * TINY_SIZE["num_layers"]  # the 2 checkpointed points: 1 step each, every layer
    figure_png, _ = plot_train(csv_path)  # a line per kind of step
    assert figure_png.stat().st_size > 5000


def test_mfu_on_a_known_gpu_is_over_its_dense_datasheet_peak() -> None:
    """A GPU in mcsd/bench/peaks.py: its dense peak for the dtype (named with its source), whatever
    was measured; an unknown GPU and a CPU: the measured peak, said so."""
    from mcsd.bench.peaks import known_gpu, mfu_peak

    assert mfu_peak("cuda", "NVIDIA H100 80GB HBM3", "bfloat16", 4e14) == (
        989.4e12, "H100 SXM dense bfloat16 peak (NVIDIA H100 Tensor Core GPU datasheet (SXM5))")
    assert mfu_peak("cuda", "NVIDIA H100 PCIe", "bfloat16", 4e14)[0] == 756e12
    assert mfu_peak("cuda", "NVIDIA H200", "float32", 4e13)[0] == 67e12
    assert known_gpu("NVIDIA H200").name == "H200 SXM" and known_gpu("NVIDIA H200 NVL").name == "H200 NVL"
    assert mfu_peak("cuda", "NVIDIA H200 NVL", "bfloat16", 4e14)[0] == 835.5e12  # not the SXM's 989.4
    assert mfu_peak("cuda", "NVIDIA A100-SXM4-80GB", "float16", 1e14)[0] == 312e12
    assert known_gpu("NVIDIA L40S").name == "L40S" and known_gpu("NVIDIA L4").name == "L4"
    assert known_gpu("NVIDIA GeForce RTX 4090").flops["bfloat16"] == 165.2e12
    assert mfu_peak("cuda", "Some Future GPU", "bfloat16", 5e14) == (
        5e14, "measured matmul peak (Some Future GPU is not in mcsd/bench/peaks.py)")
    assert mfu_peak("cpu", "cpu", "float32", 2e11) == (2e11, "measured matmul peak")


def test_the_short_paper_grid_is_the_paper_configuration_in_a_few_points() -> None:
    """``bench=paper_quick``: 1.6B in bf16 on a GPU; MCSD and the Transformer decoding at batch 1,
    16 and 64 and 1,024 and 8,192 new tokens, compiled and replayed as CUDA graphs; training forms at 2048-16384 tokens,
    in a 32768-token step each (activation-checkpointed), no batch-1 point, each with its documents joined
    and apart; every model whose mixers run an op with the PyTorch forms and fla's kernels (the Transformer once)."""
    from mcsd.bench.plan import plan

    with initialize_config_module("mcsd.conf", version_base="1.3"):
        cfg = compose("bench", overrides=["bench=paper_quick"])
        inference = plan(cfg)
        cfg.mode, cfg.models = "train", None  # mode=train models=null: every architecture
        train = plan(cfg)
    assert (cfg.model_size, cfg.dtype, cfg.device, cfg.compile, cfg.cuda_graphs) == ("1.6b", "bfloat16", "cuda", True, True)
    # Every point is named by the schema's labels, in its order (a new axis: the plan and LABELS, nothing else).
    assert {tuple(labels) for labels, _ in inference} == {LABELS["inference"]}
    assert {tuple(labels) for labels, _ in train} == {LABELS["train"]}
    assert all(set(LABELS[mode]) <= set(COLUMNS[mode]) for mode in LABELS)
    assert {(arguments["compile"], arguments["cuda_graphs"]) for _, arguments in inference} == {(True, True)}
    # Each pair the figures compare side by side, the shortest lengths first (a run cut short has compared some).
    def backends(name: str) -> list[str]:
        return ["torch", "fla"] if registry.get(name).fla_ops else ["torch"]

    assert [(labels["model"], labels["kernels"], labels["batch"], labels["gen_len"]) for labels, _ in inference] == [
        (model, kernels, batch, length) for length in (1024, 8192) for batch in (1, 16, 64)
        for model in ("mcsd", "transformer") for kernels in backends(model)]
    assert all(labels["kernels"] == arguments["kernels"] for labels, arguments in inference + train)
    assert [(labels["model"], labels["kernels"], labels["documents"], labels["batch"], labels["seq_len"],
             labels["activation_checkpointing"]) for labels, _ in train] == [
        (name, kernels, documents, *step) for step in ((16, 2048, True), (4, 8192, True), (2, 16384, True))
        for name in registry.architectures() for kernels in backends(name) for documents in ("joined", "apart")]
    assert all(labels["documents"] == arguments["documents"] and arguments["document_tokens"] == 512
               for labels, arguments in train)


def test_spread_is_the_range_over_the_median() -> None:
    assert spread([1.0, 1.1, 1.3]) == pytest.approx(0.3 / 1.1)
    assert spread([2.0]) == 0.0 and spread([1.0, 3.0]) == 1.0


@pytest.fixture
def busy_core():
    """Another process keeping one core busy (a loop in Python), for as long as the test runs:
    started through a shell that exits at once, so not a descendant of this process (whose own
    children are its own work), as another user's job would be."""
    shell = subprocess.run(["sh", "-c", f"'{sys.executable}' -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                           capture_output=True, text=True, check=True)
    spinner = int(shell.stdout)
    time.sleep(0.5)
    yield spinner
    os.kill(spinner, signal.SIGKILL)


@pytest.mark.slow
def test_other_work_is_measured_in_cores(busy_core: int) -> None:
    """A process spinning on one core is other work of about one core (the suite's other worker
    may add to it); this process's own work is not counted, nor its children's (a compiler's
    worker processes), live or finished."""
    assert sample_other_cores(1.0) >= 0.8
    start = read_clock()
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # this process busy too: its own time is left out
        pass
    assert 0.8 <= other_cores(start, read_clock()) < 1.9
    # A child of this process spinning for 2 CPU seconds: its time is this process's own while it runs
    # (os.times counts a child only once it has finished and been waited for) and after.
    start = read_clock()
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile time.process_time() < 2.0: pass"])
    counted, deadline = 0.0, time.monotonic() + 30
    while time.monotonic() < deadline and child.poll() is None:
        counted = read_clock().own - start.own
        if counted >= 0.5:
            break
        time.sleep(0.05)
    assert counted >= 0.5  # seen while the child was still running
    child.wait()
    assert read_clock().own - start.own >= 2.0


@pytest.mark.slow
def test_a_busy_machine_is_refused_in_one_line_before_anything_is_written(
        tmp_path: Path, busy_core: int) -> None:
    with pytest.raises(MCSDError, match=r"other work keeps \d+\.\d of this machine's \d+ cores busy \(more than "
                                        r"busy_cores=0.5\).*busy_machine=wait waits for it\), or busy_machine=measure"):
        run_bench(tmp_path / "refused", *TINY_INFERENCE, "models=[mcsd]", "busy_machine=refuse")
    assert not (tmp_path / "refused").exists()


@pytest.mark.slow
def test_busy_machine_measure_marks_the_points_that_shared_the_cores(
        tmp_path: Path, busy_core: int, caplog: pytest.LogCaptureFixture) -> None:
    """``busy_machine=measure``: every point records the cores other work took while it ran
    (``other_cores``: at least the spinning one) and is ``shared``; one warning says how many; the
    repeats' spread is in its columns (min <= median <= max; ``unsteady`` past SPREAD_LIMIT), and
    ``threads`` is the point's torch threads."""
    csv_path = run_bench(tmp_path, *TINY_INFERENCE, "models=[mcsd]", "inference.batch_sizes=[1]", "busy_machine=measure",
                         "threads=1", "isolate=false")
    frame = pd.read_csv(csv_path)
    assert (frame["other_cores"] >= 0.8).all() and frame["shared"].all() and (frame["threads"] == 1).all()
    assert (frame["decode_s_per_token_min"] <= frame["decode_s_per_token"]).all()
    assert (frame["decode_s_per_token"] <= frame["decode_s_per_token_max"]).all()
    spreads = (frame["decode_s_per_token_max"] - frame["decode_s_per_token_min"]) / frame["decode_s_per_token"]
    assert list(frame["unsteady"]) == list(spreads > SPREAD_LIMIT)
    assert json.loads((tmp_path / "results.json").read_text())["header"]["other_cores_before"] >= 0.8
    assert any("2 of 2 points ran while other work kept more than 0.5 cores busy" in record.getMessage()
               for record in caplog.records)


def test_busy_machine_wait_waits_for_the_other_work_to_stop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    readings = iter([1.5, 1.2, 0.1])
    monkeypatch.setattr("mcsd.bench.load.sample_other_cores", lambda: next(readings))
    monkeypatch.setattr("mcsd.bench.load.time.sleep", lambda seconds: None)
    csv_path = run_bench(tmp_path, *TINY_INFERENCE, "models=[mcsd]", "inference.batch_sizes=[1]",
                         "inference.gen_lengths=[4]", "busy_machine=wait", "isolate=false")
    assert len(pd.read_csv(csv_path)) == 1
    waiting = [line for line in capsys.readouterr().out.splitlines() if line.startswith("mcsd-bench: waiting")]
    assert [line.split(": ")[2].split(" cores")[0] for line in waiting] == ["1.5", "1.2"]
    assert json.loads((tmp_path / "results.json").read_text())["header"]["other_cores_before"] == 0.1


@pytest.mark.parametrize("kind", ["inference", "train"])
def test_points_taken_on_a_shared_machine_or_unsteady_are_drawn_hollow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       kind: str) -> None:
    """The CSV marks points taken while other work shared the cores (shared) or whose repeats
    spread (unsteady): the figures draw exactly those hollow, say so in the legend, and count
    them in the title."""
    rows = [{"model": model, "arch": model, "form": "chunk", "batch": 1, "gen_len": length, "seq_len": length,
             "status": "ok", "peak_mem_bytes": 2**20, "latency_s": 0.1, "tokens_per_s": 1000.0 + length, "mfu": 0.1,
             "shared": model == "mcsd" and length == 256, "unsteady": model == "transformer" and length == 512}
            for model in ("mcsd", "transformer") for length in (128, 256, 512)]
    csv_path = tmp_path / "results.csv"
    pd.DataFrame(rows).to_csv(csv_path, index=False)
    figures = []
    monkeypatch.setattr("mcsd.plots.cost.save_figure", lambda figure, folder, name: figures.append(figure) or [])
    (plot_inference if kind == "inference" else plot_train)(csv_path)
    ax = figures[0].axes[0]
    hollow = sorted((float(x), float(y)) for line in ax.get_lines() if line.get_markerfacecolor() == "white"
                    for x, y in zip(line.get_xdata(), line.get_ydata()))
    x_of = {"inference": "gen_len", "train": "seq_len"}[kind]
    scale = 2.0**-20 if kind == "inference" else 1.0  # Fig. 5 draws MiB; the training figure's first panel tokens/s
    y_of = "peak_mem_bytes" if kind == "inference" else "tokens_per_s"
    assert hollow == sorted((float(row[x_of]), float(row[y_of]) * scale) for row in rows
                            if row["shared"] or row["unsteady"])
    legend = ax.get_legend() if kind == "inference" else figures[0].legends[0]  # the training figure's: one below its panels
    assert HOLLOW_NOTE in [text.get_text() for text in legend.get_texts()]
    title = ax.get_title() if kind == "inference" else figures[0]._suptitle.get_text()
    assert "2 of 6 points hollow: shared machine or unsteady repeats" in title


def test_series_of_one_architecture_have_markers_of_their_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An architecture's series (its weight formats and runtimes) share its colour and each has a
    marker of its own at every batch size (line styles tell the batch sizes apart), so that they
    are told apart at a single point too; an architecture of one series keeps a marker per batch
    size as before."""
    rows = [{"model": model, "arch": model, "weights": weights, "runtime": "torch", "form": "chunk", "batch": batch,
             "gen_len": 64, "status": "ok", "peak_mem_bytes": 2**20, "latency_s": 0.1, "tokens_per_s": 1000.0}
            for model, formats in (("mcsd", ("full", "int8", "int4")), ("transformer", ("full",)))
            for weights in formats for batch in (1, 4)]
    csv_path = tmp_path / "results.csv"
    pd.DataFrame(rows).to_csv(csv_path, index=False)
    figures = []
    monkeypatch.setattr("mcsd.plots.cost.save_figure", lambda figure, folder, name: figures.append(figure) or [])
    plot_inference(csv_path)
    drawn = {line.get_label(): line.get_marker() for line in figures[0].axes[0].get_lines()
             if not line.get_label().startswith("_")}
    mcsd_batch1 = [drawn[f"MCSD, {weights} weights, batch=1"] for weights in ("full", "int8", "int4")]
    mcsd_batch4 = [drawn[f"MCSD, {weights} weights, batch=4"] for weights in ("full", "int8", "int4")]
    assert len(set(mcsd_batch1)) == 3
    assert mcsd_batch4 == mcsd_batch1
    assert drawn["Transformer, batch=1"] != drawn["Transformer, batch=4"]


@torch.no_grad()
def test_a_recorded_steps_reads_are_its_whole_capacity_bucket() -> None:
    """The bandwidth limit of a step replayed at fixed addresses counts what it reads: a
    Transformer's recorded step attends over its whole KV-cache bucket (a power of two up to twice
    the positions so far), the eager step over the positions so far."""
    model = tiny_model("transformer")
    step = StaticStep(model, record="call", min_capacity=4)
    input_ids = torch.randint(0, model.config.vocab_size, (2, 23))
    logits, state = step.prefill(input_ids[:, :3])
    for position in range(3, 23):  # positions 3..22: buckets 4 (once), 8 (4 times), 16 (8), 32 (7)
        logits, state = step(input_ids[:, position].clone(), state)
    assert kv_positions_read(step, 2, 3, 20) == pytest.approx((4 + 4 * 8 + 8 * 16 + 7 * 32) / 20)
    assert kv_positions_read(model.step, 2, 3, 20) == 3 + 21 / 2


def test_a_time_budget_starts_only_the_points_that_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """time_budget_s: a point starts when the time so far and its estimate fit; the estimate is
    the latest point of its model (else the slowest rate seen) scaled by the tokens it decodes
    (warm-up passes with CUDA graphs: the whole length; repeats)."""
    from mcsd.bench.grid import PointBudget
    from mcsd.bench.plan import point_work

    clock = [0.0]
    monkeypatch.setattr("mcsd.bench.grid.time.monotonic", lambda: clock[0])
    budget = PointBudget(100)
    short = {"model_cfg": {"name": "a"}, "prompt_len": 16, "gen_len": 4, "warmup": 1, "repeats": 2}
    assert point_work(short) == 16 + 4 + 2 * 4 and point_work({**short, "cuda_graphs": True, "gen_len": 32}) == 16 + 32 + 64
    assert budget.allows(short)  # nothing measured yet: the first point runs
    clock[0] = 28.0
    budget.record(short, 28.0)  # 1 s per token
    longer = {**short, "gen_len": 8}
    assert budget.estimate(longer) == 40 and budget.allows(longer)  # 28 + 40 <= 100
    clock[0] = 68.0
    budget.record(longer, 40.0)
    assert not budget.allows({**short, "gen_len": 16})  # 68 + 64 > 100
    assert budget.estimate({**short, "model_cfg": {"name": "b"}}) == 28  # another model: the slowest rate seen
    assert PointBudget(None).allows(longer)
    training = {"model_cfg": {"name": "a"}, "batch_size": 4, "seq_len": 64, "warmup": 1, "repeats": 3}
    assert point_work(training) == 4 * 4 * 64


def test_a_grid_past_its_time_budget_keeps_what_it_measured(tmp_path: Path) -> None:
    """A budget the first point already uses up: that point is measured, no other starts, the
    results say complete=false of the 4 planned, and every row records its point's seconds."""
    csv_path = run_bench(tmp_path, *TINY_INFERENCE, "inference.batch_sizes=[1]", "models=[mcsd,transformer]",
                         "isolate=false", "time_budget_s=0.001")
    frame = pd.read_csv(csv_path)
    assert len(frame) == 1 and (frame["point_s"] > 0).all() and not frame["complete"].any()
    head = json.loads((tmp_path / "results.json").read_text())["header"]
    assert head["points_planned"] == 4 and head["stopped_by"] == "time_budget_s=0.001"
    # The figure's title says what stopped the grid (read from the CSV as from the JSON).
    assert "incomplete: 1 of 4 points (stopped by time_budget_s=0.001)" in _title(
        {**head, "stopped_by": frame["stopped_by"].iloc[0]}, "Decoding", frame)


def test_a_resumed_grid_measures_only_the_points_it_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``resume=true``: the rows already in output_dir are kept as they are and only the grid's other
    points are measured, appended; the grid is complete when every point has a row; every row says
    when and at which commit it was measured; results of another dtype are refused in one line."""
    grid = [*TINY_INFERENCE, "inference.batch_sizes=[1]", "models=[mcsd]", "isolate=false"]
    first = pd.read_csv(run_bench(tmp_path, *grid, "inference.gen_lengths=[4]"))
    measured = []
    point = decoding.inference_point

    def counted(**arguments):
        measured.append(arguments["gen_len"])
        return point(**arguments)

    monkeypatch.setitem(runner.POINTS, "inference", counted)
    resumed = pd.read_csv(run_bench(tmp_path, *grid, "inference.gen_lengths=[4,8]", "resume=true"))
    assert measured == [8] and list(resumed["gen_len"]) == [4, 8]
    kept = [column for column in first.columns if column not in ("complete", "points_planned")]
    pd.testing.assert_frame_equal(resumed.head(1)[kept], first[kept])
    assert resumed["complete"].all() and (resumed["points_planned"] == 2).all()
    assert resumed["measured_at"].str.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00").all()
    assert resumed["git_commit"].notna().all() and resumed["measured_at"].iloc[0] <= resumed["measured_at"].iloc[1]
    again = run_bench(tmp_path, *grid, "inference.gen_lengths=[4,8]", "resume=true")  # nothing left to measure
    assert measured == [8] and pd.read_csv(again).equals(resumed)
    with pytest.raises(MCSDError, match="resume=true: the results in .* were measured with dtype='float32' and this "
                                        "grid has dtype='bfloat16': resume with the same setting, or give another"):
        run_bench(tmp_path, *grid, "inference.gen_lengths=[4,8]", "resume=true", "dtype=bfloat16")
    assert pd.read_csv(tmp_path / "results.csv").equals(resumed)  # the refusal wrote nothing
