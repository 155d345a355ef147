"""What needs a GPU (``pytest -m gpu`` on a machine with CUDA; skipped elsewhere): every
architecture's forms and decoding on CUDA in bf16 against the CPU in fp32, a ``bench=paper``-shaped
grid at ``size=small`` (eager and compiled, an out-of-memory point followed by an ok one),
``trainer=gpu`` and ``trainer=fsdp`` over nccl for a few steps, and the 1.6B build.

Each behaviour has a CPU test of its logic: the 16-bit casts (tests/models/test_precision.py), the
benchmark's failures and compiled points (tests/bench/test_bench.py), FSDP2 over gloo
(tests/training/test_distributed.py), the meta-device build (tests/models/test_conformance.py)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import mcsd
from helpers.models import SIXTEEN_BIT_TOLERANCE, assert_recurrent_states_stay_fp32, decode_with_state, relative_rms_error
from helpers.models import ONE_LAYER_OF_EACH_KIND, tiny_model, variant_cases
from helpers.runs import FAST, compose_train, read_metrics, run_bench, run_cli, series
from mcsd.models import registry
from mcsd.models.cuda_graphs import WARMUP_STEPS
from mcsd.training.run import train

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run pytest -m gpu on one")]
CUDA = torch.device("cuda")


@pytest.mark.parametrize("case", variant_cases())
@torch.no_grad()
def test_every_form_and_decoding_on_cuda_in_bf16_matches_the_cpu_in_fp32(case: str) -> None:
    """The model on the GPU in bf16 (cast, not autocast): every form, the eager step (and the
    compiled one, for each architecture's default variant: a compile per variant would take the
    GPU check's time) along a fixed token path, within the bf16 tolerance of the same weights on
    the CPU in fp32; recurrent states fp32."""
    model = tiny_model(case, hidden_size=64, num_channels=4, mlp_hidden_size=96)
    input_ids = torch.randint(0, 101, (2, 80))
    reference = model(input_ids, form="parallel")
    gpu = copy.deepcopy(model).to(CUDA, torch.bfloat16)
    tolerance = SIXTEEN_BIT_TOLERANCE[torch.bfloat16]
    for form in registry.get(case.split("/")[0]).forms:
        logits = gpu(input_ids.to(CUDA), form=form)
        assert logits.dtype == torch.bfloat16 and relative_rms_error(logits.cpu(), reference) < tolerance, form
    name, _, variant = case.partition("/")
    for compile in (False, True) if variant == next(iter(registry.get(name).variants)) else (False,):
        decoded, state = decode_with_state(gpu, input_ids.to(CUDA), split=33, compile=compile)
        assert relative_rms_error(decoded.cpu(), reference[:, 32:]) < tolerance, compile
        assert_recurrent_states_stay_fp32(gpu, state)


@pytest.mark.parametrize("compile", [False, True])
@pytest.mark.parametrize("name", registry.architectures())
@torch.no_grad()
def test_cuda_graph_decoding_records_once_and_replays_64_positions(name: str, compile: bool) -> None:
    """``model.decoding(cuda_graphs=True)`` in bf16: 64 steps after an 8-token prompt (one KV-cache
    bucket) record one CUDA graph and replay it 64 times, the Python step running only for the
    warm-up and the capture; the logits follow the eager step's along the same token path."""
    model = tiny_model(name, hidden_size=64, num_channels=4, mlp_hidden_size=96).to(CUDA, torch.bfloat16)
    input_ids = torch.randint(0, 101, (2, 72), device=CUDA)
    expected = decode_with_state(model, input_ids, split=8)[0]
    prefill, step = model.decoding(compile=compile, cuda_graphs=True)
    calls = []
    run = step.run
    step.run = lambda *arguments: calls.append(1) or run(*arguments)
    logits, state = prefill(input_ids[:, :8], max_new_tokens=64)
    outputs = [logits]
    for position in range(8, 72):
        logits, state = step(input_ids[:, position].clone(), state)
        outputs.append(logits)
    assert (step.recorded, step.replayed, len(calls)) == (1, 64, WARMUP_STEPS + 1)
    assert [type(recording.replay.__self__) for buffers in step.buffers.values()
            for recording in buffers.recordings.values()] == [torch.cuda.CUDAGraph]
    assert relative_rms_error(torch.stack(outputs, dim=1).float(), expected.float()) < 1e-2
    assert_recurrent_states_stay_fp32(model, state)


@torch.no_grad()
def test_an_error_inside_a_cuda_graph_capture_ends_the_capture() -> None:
    """An error raised while a step is being captured (not in its warm-up) is raised as itself;
    the capture is ended and dropped, so the device takes work again and the next call records
    and replays as the eager step decodes (tests/models/test_cuda_graphs.py: the same path
    on the CPU)."""
    model = tiny_model("mcsd", hidden_size=64, num_channels=4, mlp_hidden_size=96).to(CUDA, torch.bfloat16)
    input_ids = torch.randint(0, 101, (2, 24), device=CUDA)
    expected = decode_with_state(model, input_ids, split=8)[0]
    prefill, step = model.decoding(cuda_graphs=True)
    run, calls = step.run, []

    def failing(*arguments: object) -> torch.Tensor:
        calls.append(1)
        if len(calls) == WARMUP_STEPS + 1:  # the captured call
            raise RuntimeError("injected failure in the capture")
        return run(*arguments)

    step.run = failing
    logits, state = prefill(input_ids[:, :8], max_new_tokens=16)
    with pytest.raises(RuntimeError, match="injected failure in the capture"):
        step(input_ids[:, 8].clone(), state)
    assert not torch.cuda.is_current_stream_capturing()
    torch.ones(4, device=CUDA).sum().item()  # the device takes work again
    step.run = run
    outputs = [logits]
    for position in range(8, 24):
        logits, state = step(input_ids[:, position].clone(), state)
        outputs.append(logits)
    assert step.recorded == 1
    assert relative_rms_error(torch.stack(outputs, dim=1).float(), expected.float()) < 1e-2


def test_a_paper_shaped_grid_keeps_every_point(tmp_path: Path) -> None:
    """``bench=paper`` at ``size=small`` (bf16, in this process): MCSD and the Transformer, an
    allocation far past the GPU's memory (a batch of a million prompts) recorded as ``oom`` and
    the next point measured; eager and compiled, each compiled point compiled; decoding replayed as
    CUDA graphs (``bench=paper``'s), every graph recorded in the warm-up."""
    for compile in ("false", "true"):
        csv_path = run_bench(tmp_path / compile, "bench=paper", "model_size=small", "models=[mcsd,transformer]",
                             "inference.batch_sizes=[1000000,1,16]", "inference.gen_lengths=[128]",
                             "inference.repeats=2", f"compile={compile}")
        frame = pd.read_csv(csv_path)
        assert list(frame["status"]) == ["oom", "ok", "ok"] * 2, frame[["model", "batch", "status", "reason"]]
        measured = frame[frame["status"] == "ok"]
        assert (measured["compiled"] == (compile == "true")).all() and frame["reason"][0].startswith("OutOfMemoryError")
        assert frame["cuda_graphs"].all() and (measured["graphs_recorded_timed"] == 0).all()
        assert (measured["weights_bytes"] == 2 * measured["params"]).all()  # built in bf16
        assert json.loads((tmp_path / compile / "results.json").read_text())["header"]["complete"] is True
    train_csv = run_bench(tmp_path / "train", "bench=paper", "mode=train", "model_size=small", "models=[mcsd,transformer]",
                          "train.seq_lens=[2048]", "train.forms=[training]", "train.repeats=2", "train.warmup=1")
    assert (pd.read_csv(train_csv)["status"] == "ok").all()


def test_trainer_gpu_trains_a_few_steps(tmp_path: Path) -> None:
    val_loss = train(compose_train(tmp_path / "run", *FAST, "trainer=gpu", "logger=csv", "test_after_training=false"))
    losses = series(read_metrics(tmp_path / "run"), "train/loss")
    assert len(losses) == 6 and math.isfinite(val_loss)  # logged every step


def test_fsdp_over_nccl_on_every_gpu(tmp_path: Path) -> None:
    """``trainer=fsdp`` over nccl with one process per GPU (one GPU runs the path too): trains,
    writes sharded checkpoints and a final model that loads."""
    devices = torch.cuda.device_count()
    result = run_cli("mcsd-train", *FAST, "logger=csv", "test_after_training=false", "trainer=fsdp",
                     f"trainer.devices={devices}", "paths.log_dir=logs", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    assert (run / "checkpoints" / "last.ckpt").is_dir() and mcsd.load(run).config.num_layers > 0


@torch.no_grad()
def test_a_1_6b_model_is_built_once_on_the_gpu_in_bf16() -> None:
    """``size=1.6b`` built on the GPU in bf16: its parameters, every one finite, and no more memory
    than its bf16 weights (no fp32 copy, nothing built on the CPU first)."""
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        node = OmegaConf.to_container(compose("build", overrides=["model=mcsd", "size=1.6b"]).model, resolve=True)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    model = mcsd.build_model(node, device=CUDA, dtype=torch.bfloat16)
    params = sum(parameter.numel() for parameter in model.parameters())
    assert params == mcsd.count_parameters(node)
    assert {(parameter.device.type, parameter.dtype) for parameter in model.parameters()} == {("cuda", torch.bfloat16)}
    assert all(torch.isfinite(parameter).all() for parameter in model.parameters())
    assert torch.cuda.max_memory_allocated() - before < 1.05 * 2 * params


@pytest.mark.parametrize("name", registry.architectures())
def test_attention_at_the_paper_size_runs_in_a_fused_kernel(name: str) -> None:
    """Every architecture at ``size=1.6b``'s widths (one layer of each kind, bf16), forward and
    backward in its parallel and training forms with SDPA restricted to its fused kernels (no
    math fallback): each attention call finds one (the CPU test checks every call's width)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with initialize_config_module("mcsd.conf", version_base="1.3"):
        node = OmegaConf.to_container(compose("build", overrides=[f"model={name}", "size=1.6b"]).model, resolve=True)
    model = mcsd.build_model({**node, **ONE_LAYER_OF_EACH_KIND.get(name, {"num_layers": 1})}, device=CUDA,
                             dtype=torch.bfloat16)
    ids = torch.randint(0, node["vocab_size"], (1, 512), device=CUDA)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        for form in ("parallel", model.default_form):
            loss, _ = model.loss(ids[:, :-1], ids[:, 1:], form=form)
            loss.backward()
            assert torch.isfinite(loss)


@pytest.mark.parametrize("with_bias", [False, True], ids=["plain", "key_bias"])
def test_documents_apart_attend_through_flex_attention_as_through_the_mask(with_bias: bool) -> None:
    """On CUDA, ``document_attention``'s default is FlexAttention with the documents' block mask,
    compiled (called eagerly, and inside a compiled function): its values and gradients (with
    respect to queries, keys, values and the key bias)
    are the unfused path's (SDPA over each document's span) in fp32 (within 1e-4 and 1e-3 relative), at 4,096 tokens packed
    with documents of lengths 1..1,500 (its CPU test compares the values alone: FlexAttention
    has no backward on a CPU)."""
    from mcsd.ops.attention import document_attention
    from mcsd.ops.common import document_index

    generator = torch.Generator().manual_seed(0)
    lengths = [1, 2, 63, 64, 65, 301, 1500]
    lengths.append(4096 - sum(lengths))
    position_ids = torch.cat([torch.arange(length) for length in lengths])[None].repeat(2, 1).to(CUDA)
    document = document_index(position_ids == 0)
    query, key, value = (torch.randn(2, 4, 4096, 64, generator=generator).to(CUDA).requires_grad_() for _ in range(3))
    key_bias = (-torch.rand(2, 4, 4096, generator=generator)).to(CUDA).requires_grad_() if with_bias else None
    inputs = [query, key, value] + ([key_bias] if with_bias else [])
    weights = torch.randn(2, 4, 4096, 64, generator=generator).to(CUDA)
    results = []
    # None: the device's default, fused on CUDA; then inside a compiled function, as a compiled model calls it.
    for attend, fused in ((document_attention, None), (torch.compile(document_attention), None),
                          (document_attention, False)):
        attended = attend(query, key, value, document, key_bias, fused=fused)
        results.append((attended.detach(), torch.autograd.grad((attended * weights).sum(), inputs)))
    *fused_results, (masked, masked_grads) = results
    for flex, flex_grads in fused_results:
        assert relative_rms_error(flex, masked) < 1e-4
        assert all(relative_rms_error(f, m) < 1e-3 for f, m in zip(flex_grads, masked_grads))


@pytest.mark.parametrize("name", registry.architectures())
def test_int8_weights_run_every_form_and_decoding_on_a_gpu(name: str) -> None:
    """weights=int8 on CUDA (torchao's Int8WeightOnlyConfig, the config the CPU tests run): every
    form and decoding of a bf16 model agree with the same model's full weights."""
    pytest.importorskip("torchao")
    from mcsd.deploy.quantize import quantize_weights

    torch.manual_seed(0)
    full = tiny_model(name, hidden_size=64, num_channels=4, mlp_hidden_size=128, vocab_size=128,
                      **ONE_LAYER_OF_EACH_KIND.get(name, {})).to(CUDA, torch.bfloat16)
    model = quantize_weights(copy.deepcopy(full), "int8")
    ids = torch.randint(0, 128, (2, 40), device=CUDA)
    with torch.no_grad():
        reference = full(ids).float()
        for form in model.architecture.forms:
            assert relative_rms_error(model(ids, form=form).float(), reference) < 0.05, form
        decoded, _ = decode_with_state(model, ids, 24)
    assert relative_rms_error(decoded.float(), reference[:, 23:]) < 0.05


def test_the_context_probe_runs_on_a_gpu_as_on_the_cpu() -> None:
    """The long-context probe of a model on CUDA (its losses brought to the CPU batch by batch,
    as the summary and a resumed probe read them) gives the CPU's Delta_N to fp32 round-off."""
    from mcsd.probes.context import probe_context

    model = tiny_model("mcsd").eval()
    documents = torch.randint(0, model.config.vocab_size, (4, 80))
    on_cpu = probe_context(model, documents, [8, 24], num_positions=3, batch_size=2, bootstrap=0)
    on_gpu = probe_context(copy.deepcopy(model).to(CUDA), documents.to(CUDA), [8, 24], num_positions=3, batch_size=2,
                           bootstrap=0)
    for column in ("delta", "swapped", "loss_full", "loss_last"):
        assert on_gpu.deltas[column].to_numpy() == pytest.approx(on_cpu.deltas[column].to_numpy(), abs=1e-4), column
