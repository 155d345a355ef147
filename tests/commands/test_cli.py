"""mcsd-train as a user runs it: multirun sweeps, DDP, and one-line errors for bad input."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import hydra.utils
import pytest
import torch
import yaml
from hydra.errors import InstantiationException
from lightning.pytorch.utilities.model_summary.model_summary import get_human_readable_count

import mcsd
from helpers.runs import FAST, command, read_metrics, run_cli, run_here, series, train_refusal
from mcsd.commands.app import run_or_exit
from mcsd.errors import MCSDError
from mcsd.models import registry

QUICK = [*FAST, "trainer.max_steps=2", "trainer.val_check_interval=2", "test_after_training=false"]


@pytest.mark.slow
def test_multirun_gives_every_job_its_own_run(tmp_path: Path) -> None:
    result = run_cli("mcsd-train", "-m", "model=mcsd,transformer", *QUICK, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    sweeps = list((tmp_path / "logs" / "train" / "multiruns").iterdir())
    assert len(sweeps) == 1
    jobs = sorted(path for path in sweeps[0].iterdir() if path.is_dir() and path.name.isdigit())
    assert [job.name for job in jobs] == ["0", "1"]
    wandb_ids = set()
    for job, model in zip(jobs, ["mcsd", "transformer"]):
        assert (job / ".hydra" / "overrides.yaml").read_text().count(f"model={model}") == 1
        assert len(series(read_metrics(job), "train/loss")) == 2
        runs = list((job / "wandb").glob("offline-run-*"))
        assert len(runs) == 1
        wandb_ids.add(runs[0].name.rsplit("-", 1)[1])
        assert (job / "model" / "config.json").read_text().count(model.replace("mcsd", "MCSD").replace(
            "transformer", "Transformer")) == 1
    assert len(wandb_ids) == 2
    # The sweep ends with one summary: its folder, each job's own override and result, the one command that
    # uploads its offline W&B runs, the plot command.
    results = [json.loads((job / "result.json").read_text()) for job in jobs]
    assert result.stdout.strip().splitlines()[-5:] == [
        f"sweep: {sweeps[0]} (2 jobs)",
        f"  job 0: model=mcsd: val ppl {results[0]['val_ppl']:.2f}",
        f"  job 1: model=transformer: val ppl {results[1]['val_ppl']:.2f}",
        f"W&B: 2 offline run folders: upload them with `wandb sync {sweeps[0]}/*/wandb/offline-run-*`",
        f"plot: mcsd-plot ablation source={sweeps[0]} (or mcsd-plot scaling source={sweeps[0]} for a sweep of sizes)"]


@pytest.mark.slow
def test_runs_started_together_get_distinct_directories_and_print_no_third_party_warnings(tmp_path: Path) -> None:
    """Two runs started in the same second write to different run directories. Neither prints
    deprecation notes of dependencies, Lightning tips or a W&B note about a setting we never
    set: what a run prints on stderr is progress and its own messages (with the default
    loggers, W&B offline and CSV)."""
    script = command("mcsd-train")
    logs = [tmp_path / f"stderr-{index}.txt" for index in range(2)]  # files: neither waits on a full pipe
    with logs[0].open("w") as first, logs[1].open("w") as second:
        processes = [subprocess.Popen([str(script), *QUICK], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr)
                     for stderr in (first, second)]
        codes = [process.wait(timeout=300) for process in processes]
    for code, log in zip(codes, logs):
        assert code == 0, log.read_text()[-3000:]
        stderr = log.read_text()
        noise = [line for line in stderr.splitlines()
                 if "warn" in line.lower() or "deprecated" in line or "Tip:" in line or "anonymous" in line
                 or "was configured so 100%" in line or "weights_only" in line]
        assert noise == []
    runs = list((tmp_path / "logs" / "train" / "runs").iterdir())
    assert len(runs) == 2 and all((run / "model" / "model.safetensors").is_file() for run in runs)


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 4-step run of the tiny model (checkpoints at step 3 and last.ckpt): (cwd, run dir)."""
    cwd = tmp_path_factory.mktemp("stopped")
    result = run_here("mcsd-train", *QUICK, "trainer.max_steps=4", "logger=csv", cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (cwd / "logs" / "train" / "runs").iterdir()
    return cwd, run


def newest_run(cwd: Path, before: set[Path]) -> Path:
    (run,) = set((cwd / "logs" / "train" / "runs").iterdir()) - before
    return run


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ckpt_path", "resume"])
def test_resume_needs_no_overrides_repeated(stopped_run: tuple[Path, Path], how: str) -> None:
    """`ckpt_path=RUN/checkpoints/last.ckpt` or `resume=RUN` alone: the run's own overrides come
    back (size=tiny, its data and logger settings); this command's go on top (max_steps)."""
    cwd, run = stopped_run
    before = set((cwd / "logs" / "train" / "runs").iterdir())
    target = f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}" if how == "ckpt_path" else f"resume={run}"
    result = run_here("mcsd-train", target, "trainer.max_steps=6", cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = newest_run(cwd, before)
    assert sorted(series(read_metrics(resumed), "train/loss")) == [3, 4, 5]
    hparams = yaml.safe_load((resumed / "csv" / "version_0" / "hparams.yaml").read_text())
    assert hparams["choices"]["size"] == "tiny" and hparams["model"]["hidden_size"] == 64
    assert hparams["data"]["seq_len"] == 64 and not (resumed / "wandb").exists()  # logger=csv came back
    assert hparams["ckpt_path"] == str(run / "checkpoints" / "last.ckpt")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.hidden_size=128"], "the overrides change the model (embed.weight: (512, 64) in the checkpoint, "
                                    "(512, 128) now); a resumed run keeps its model: drop the model/size overrides"),
        (["ablation=slope_only"], "the overrides change the model (layers.0.mixer.sections.1.norm.weight: (4, 16) in "
                                   "the checkpoint, absent now)"),
        (["model=transformer"], "that run trained MCSD (model=mcsd), and model=transformer asks for Transformer; a "
                                "resumed run keeps its model: drop model=transformer, or leave out resume= to train "
                                "transformer from scratch"),
    ],
)
def test_resume_refuses_a_different_model_in_one_line(stopped_run: tuple[Path, Path], tmp_path: Path,
                                                      overrides: list[str], message: str) -> None:
    _, run = stopped_run
    before = _snapshot(run)
    assert message in train_refusal(tmp_path / "run", f"resume={run}", *overrides)
    assert _snapshot(run) == before


def _snapshot(directory: Path) -> dict[str, str]:
    return {str(path): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A finished run in the working directory, which the bad commands below must not touch."""
    cwd = tmp_path_factory.mktemp("cwd")
    result = run_here("mcsd-train", *QUICK, "logger=csv", cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (cwd / "logs" / "train" / "runs").iterdir()
    return cwd, _snapshot(run)


@pytest.fixture(scope="module")
def bad_inputs(earlier_run: tuple[Path, dict[str, str]]) -> Path:
    """The earlier run's working directory with the files the bad commands below name."""
    cwd, _ = earlier_run
    (cwd / "empty.txt").write_text("  \n")
    (cwd / "small.txt").write_text("a few words, far fewer than one block of 512 tokens.\n" * 5)
    (cwd / "latin1.txt").write_bytes("Un caf\u00e9 ? Un th\u00e9.\n".encode("latin-1") * 50)
    (cwd / "utf16.txt").write_bytes("Un caf\u00e9 ? Un th\u00e9.\n".encode("utf-16") * 50)
    (cwd / "garbage.ckpt").write_bytes(bytes(range(256)) * 20)
    (cwd / "afile").write_text("a file where a folder is asked for\n")
    story = "\n".join(f"line {index} of a story about {index % 17} foxes and {index % 5} hens" for index in range(600))
    (cwd / "story.txt").write_text(story)
    (cwd / "story_copy.txt").write_text(story)  # the same text under another name
    (cwd / "neither.csv").write_text("step,loss\n1,2.5\n")
    inference = "model,batch,gen_len,status,peak_mem_bytes,latency_s,tokens_per_s\n"
    (cwd / "errors.csv").write_text(inference + "mcsd,0,128,error,,,\nmcsd,0,512,error,,,\n")
    (cwd / "negative.csv").write_text(inference + "mcsd,1,-128,ok,1000,0.5,-6214\nmcsd,1,128,ok,1000,0.5,256\n")
    (cwd / "notes").mkdir()
    (cwd / "notes" / "notes.txt").write_text("a user's own file, which no export may delete\n")
    (earlier,) = (cwd / "logs" / "train" / "runs").iterdir()
    checkpoint = (earlier / "checkpoints" / "last.ckpt").read_bytes()
    (cwd / "truncated.ckpt").write_bytes(checkpoint[: len(checkpoint) // 2])
    truncated_run = cwd / "truncated_run"  # a run whose last.ckpt was cut short, with a whole step checkpoint beside it
    shutil.copytree(earlier, truncated_run)
    (truncated_run / "checkpoints" / "step-000002.ckpt").write_bytes(checkpoint)
    (truncated_run / "checkpoints" / "last.ckpt").write_bytes(checkpoint[: len(checkpoint) // 2])
    for folder, names in [("earlier_bench", ["results.json", "results.csv"]), ("earlier_eval", ["results.json", "table2.md"]),
                          ("earlier_probe", ["context_curve.csv", "context_delta.csv"])]:  # earlier results, kept whole
        (cwd / folder).mkdir()
        for name in names:
            (cwd / folder / name).write_text(f"the earlier run's {name}\n")
    broken = cwd / "broken_model"  # a model folder whose weights were cut short
    shutil.copytree(earlier / "model", broken)
    weights = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    return cwd


OFFLINE = {"HF_ENDPOINT": "http://127.0.0.1:9"}  # a closed local port stands in for the Hub: never the network
NO_WANDB_KEY = {"WANDB_MODE": "online", "WANDB_API_KEY": None, "HOME": "."}  # no ~/.netrc either
# Every bad input, each through its command: (command, arguments, environment, the app's label
# in its one line, what the line says). mcsd-train's cases also get FAST's settings. The
# README's list first, then the rest; new bad inputs join the table.
BAD_INPUTS = [
    ("mcsd-train", ["data=text_files", "data.paths=[missing.txt]"], {}, None, "data.paths: missing.txt does not exist"),
    ("mcsd-train", ["data=text_files", "data.paths=[small.txt]", "data.sample_by=line", "data.seq_len=512"], {}, None,
     "data.seq_len=512 is too long for this corpus"),
    ("mcsd-train", ["data=wikitext103"], OFFLINE, None,
     "data=wikitext103 needs the Hugging Face Hub, which is unreachable from here: use data=text_files"),
    ("mcsd-train", ["trainer.max_steps=-5"], {}, None, "trainer.max_steps=-5 must be a positive number of steps"),
    ("mcsd-train", ["resume=EARLIER", "trainer.max_steps=2"], {}, None, "that run finished (step 2 of 2); to train on "
     "from it, give a larger trainer.max_steps (now 2) beside resume="),
    ("mcsd-train", ["+trainer.max_step=5"], {}, None,
     "trainer.max_step is not a setting of lightning.pytorch.trainer.Trainer: did you mean trainer.max_steps?"),
    ("mcsd-train", ["data=text_files", "data.paths=[logs]"], {}, None,
     "data.paths: logs is a folder: list its files, e.g. data.paths=[logs/a.txt]"),
    ("mcsd-train", ["data=text_files", "data.paths=logs"], {}, None,  # a string as well as a list
     "data.paths: logs is a folder: list its files, e.g. data.paths=[logs/a.txt]"),
    ("mcsd-train", ["size=huge"], {}, None,
     "size=huge is not an option of size: use one of 1.6b, 10b, 3b, base, small, tiny"),
    ("mcsd-train", ["data=text_files"], {}, None,
     "data.paths is missing: give it on the command line (data.paths=...)"),
    ("mcsd-train", ["data=text_files", "data.paths=[latin1.txt]"], {}, None,
     "latin1.txt is not UTF-8 text (byte 6: b'\\xe9'): convert it"),
    ("mcsd-train", ["ckpt_path=truncated.ckpt"], {}, None,
     "truncated.ckpt is not a readable checkpoint (truncated or corrupt)"),
    ("mcsd-train", ["hydra/launcher=slurm"], {"PATH": str(Path(sys.executable).parent)}, None,
     "hydra/launcher=slurm submits to SLURM, but there is no sbatch here"),
    ("mcsd-train", [], NO_WANDB_KEY, None, "logger.wandb uses W&B online but no W&B API key is set: run `wandb login`"),
    ("mcsd-train", ["optimizer.lr=-1e-3"], {}, None, "optimizer.lr=-0.001 must be 0 or more"),
    ("mcsd-train", ["model.kernels=fla"], {}, None,
     "model.kernels=fla runs Triton kernels on a CUDA GPU, and this model runs on cpu: use model.kernels=auto"),
    ("mcsd-train", ["model.kernels=triton"], {}, None, "model.kernels='triton' is unknown: use one of auto, torch, fla"),
    ("mcsd-train", ["optimizer.betas=[0.9,1.5]"], {}, None, "optimizer.betas=[0.9, 1.5] must be two numbers in [0, 1)"),
    ("mcsd-train", ["optimizer.weight_decay=-0.1"], {}, None, "optimizer.weight_decay=-0.1 must be 0 or more"),
    ("mcsd-train", ["scheduler.warmup_steps=50"], {}, None,
     "scheduler.warmup_steps=50 is longer than the run (trainer.max_steps=6)"),
    ("mcsd-train", ["model=transformer", "model.hidden_size=100"], {}, None,
     "model.hidden_size=100 gives heads of 25 features (hidden_size / num_channels=4), and RoPE rotates pairs of them: "
     "choose a hidden_size with an even head width, e.g. model.hidden_size=104"),
    ("mcsd-train", ["compile=maybe"], {}, None, "compile=maybe must be true or false"),
    ("mcsd-train", ["seed=abc"], {}, None, "seed=abc must be a whole number (e.g. seed=0; a sweep: -m seed=0,1,2)"),
    ("mcsd-train", ["trainer.val_check_interval=0"], {}, None,
     "trainer.val_check_interval=0 must be a number of steps (1 or more) or a fraction of an epoch in (0, 1]"),
    ("mcsd-train", [], {"WANDB_MODE": "online", "WANDB_API_KEY": "0" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9"}, None,
     "logger.wandb uses W&B online, but its server (127.0.0.1) is unreachable from here: stay offline (unset "
     "WANDB_MODE; logger.wandb.offline=true) and upload later with `wandb sync`"),
    ("mcsd-train", ["data.seq_len=1000000"], {}, None, "data.seq_len=1000000 is too long for this corpus"),
    ("mcsd-train", ["data.tokenizer_path=mytok.json"], {}, None,
     "data.tokenizer_path=mytok.json does not exist (looked for "),
    ("mcsd-train", ["+sed=5"], {}, None,
     "+sed=5: sed is not a setting of mcsd-train, so it would be ignored: did you mean seed=5?"),
    ("mcsd-generate", ["+tempreature=0", "ckpt=EARLIER"], {}, None, "did you mean temperature=0?"),
    ("mcsd-train", ["resume=truncated_run"], {}, None, "truncated_run/checkpoints/last.ckpt is not a readable checkpoint "
     "(truncated or corrupt): the newest other one beside it is "),
    *([("mcsd-train", ["trainer=gpu"], {}, None, "trainer.accelerator=gpu needs a CUDA GPU, and none is visible here")]
      if not torch.cuda.is_available() else []),
    ("mcsd-train", ["scheduler.warmup_steps=soon"], {}, None,
     "scheduler.warmup_steps=soon must be auto (a tenth of the run) or a whole number of steps"),
    ("mcsd-train", ["data=text_files", "data.paths=[~/mytext.txt]"], {}, None,
     "data.paths=[~/mytext.txt] cannot be read as a setting (token recognition error at: '~'): Hydra reads ~ only "
     "inside quotes: write 'data.paths=[\"~/mytext.txt\"]'"),
    ("mcsd-train", ["paths.log_dir=afile/logs"], {}, None, "paths.log_dir=afile/logs is not writable: "),
    ("mcsd-train", ["data.seq_len=0"], {}, None, "data.seq_len=0 must be a positive whole number"),
    ("mcsd-train", ["data.val_fraction=0"], {}, None, "data.val_fraction=0 and data.test_fraction=0.05 must be"),
    ("mcsd-train", ["data=text_files", "data.paths=[empty.txt]"], {}, None, "data=text_files: the corpus has no text"),
    ("mcsd-train", ["data=text_files", "data.paths={train:[story.txt],val:[story.txt]}"], {}, None,
     "data=text_files: the val split is the training data itself: it would measure what training memorised, not "
     "held-out text; name val documents that training does not read (data.paths.val), or drop the val split"),
    ("mcsd-train", ["data=text_files", "data.paths={train:[story.txt],test:[story_copy.txt]}"], {}, None,
     "data=text_files: the test split holds only training documents ("),
    ("mcsd-train", ["model=transformer", "ablation=slope_only"], {}, None,
     "model.sections is a setting of mcsd, not of transformer"),
    ("mcsd-train", ["+logger.extra.save_dir=x"], {}, None, "logger.extra has no _target_"),
    ("mcsd-train", ["ckpt_path=nowhere.ckpt"], {}, None, "ckpt_path=nowhere.ckpt does not exist"),
    ("mcsd-train", ["ckpt_path=garbage.ckpt"], {}, None,
     "garbage.ckpt is not a readable checkpoint (truncated or corrupt): use another"),
    ("mcsd-train", ["data.num_proc=0"], {}, None, "data.num_proc=0 must be a positive number of processes"),
    ("mcsd-train", ["resume=nowhere"], {}, None, "resume=nowhere does not exist (looked for "),
    ("mcsd-train", ["data=text_files", "data.paths=[utf16.txt]"], {}, None,
     "utf16.txt is not UTF-8 text (byte 0: b'\\xff'): it is UTF-16 (it starts with that byte-order mark): convert it, "
     "e.g. iconv -f utf-16 -t utf-8"),
    ("mcsd-train", ["init_from=broken_model"], {}, None,
     "broken_model/model.safetensors is not a readable safetensors file (truncated, or not one"),
    ("mcsd-train", ["ckpt_path=EARLIER/model/model.safetensors"], {}, None,
     "model/model.safetensors is a model's weights, not a run's checkpoint: resume a run with resume=RUN_DIR"),
    ("mcsd-generate", ["ckpt=broken_model"], {}, None,
     "broken_model/model.safetensors is not a readable safetensors file (truncated, or not one"),
    ("mcsd-generate", ["ckpt=EARLIER", "temperature=-1"], {}, None, "temperature=-1 must be 0 (greedy) or more"),
    ("mcsd-generate", ["ckpt=EARLIER", "top_p=1.5"], {}, None, "top_p=1.5 must be a probability in (0, 1]"),
    ("mcsd-eval", ["ckpt=EARLIER", "tasks=local", "limit=ten"], {}, None,
     "limit=ten must be a number of documents per task (e.g. limit=100)"),
    ("mcsd-train", ["optimizer.lr=-1", "--multirun"], {}, None, "optimizer.lr=-1 must be 0 or more"),  # no sweep folder
    # Each of these replaced an earlier run's files before (exit 0, no word): results, or a run mixed into another's folder.
    ("mcsd-bench", ["output_dir=earlier_bench"], {}, None, "output_dir=earlier_bench holds the results of an earlier "
     "mcsd-bench run (results.json, results.csv): choose a new folder (leave output_dir out: each run gets one of its "
     "own), resume=true to keep its rows and measure only the points they lack, or overwrite=true to replace them"),
    ("mcsd-bench", ["output_dir=earlier_bench", "resume=true", "overwrite=true"], {}, None,
     "resume=true keeps the results in output_dir and overwrite=true replaces them: give one of them"),
    ("mcsd-eval", ["ckpt=EARLIER", "tasks=local", "output_dir=earlier_eval"], {}, None,
     "output_dir=earlier_eval holds the results of an earlier mcsd-eval run (results.json, table2.md): choose a new "
     "folder (leave output_dir out: each run gets one of its own), resume=true to keep its tasks finished and run only "
     "the rest, or overwrite=true to replace them"),
    ("mcsd-eval", ["ckpt=EARLIER", "tasks=local", "output_dir=earlier_eval", "resume=true", "overwrite=true"], {}, None,
     "resume=true keeps the results in output_dir and overwrite=true replaces them: give one of them"),
    ("mcsd-probe", ["context", "ckpt=EARLIER", "output_dir=earlier_probe"], {}, "mcsd-probe context",
     "output_dir=earlier_probe holds the results of an earlier mcsd-probe context run (context_curve.csv, "
     "context_delta.csv)"),
    # Each of these ended in Hydra's 7 lines, whose advice (+KEY=...) led to a second refusal.
    ("mcsd-train", ["trainer.max_stepz=5"], {}, None,
     "trainer.max_stepz=5: max_stepz is not a setting of trainer: did you mean trainer.max_steps=5?"),
    ("mcsd-train", ["modle=transformer"], {}, None,
     "modle=transformer: modle is not a setting or group of mcsd-train: did you mean model=transformer?"),
    ("mcsd-train", ["data=mqar", "data.documents=apart"], {}, None,
     "data.documents=apart: documents is not a setting of data=mqar: mcsd-train --help lists its settings (data holds "),
    ("mcsd-train", ["-m", "trainer.max_stepz=5,6"], {}, None, "trainer.max_stepz=5: max_stepz is not a setting of trainer"),
    ("mcsd-train", ["data=mad", "data.settings={num_tokens_to_copy: 16}"], {}, None,
     "data.settings={num_tokens_to_copy: 16}: data.settings has no key num_tokens_to_copy (it holds nothing): set each "
     "key as its own setting, data.settings.KEY=VALUE, and add a key it lacks with a +: +data.settings.num_tokens_to_copy=..."),
    # Each of these ended in a traceback (eval and probe left their run folders).
    *([("mcsd-generate", ["ckpt=EARLIER", "device=cuda"], {}, None,
        "device=cuda needs a CUDA GPU, and none is visible here: use device=cpu"),
       ("mcsd-generate", ["ckpt=EARLIER", "device=cuda", "weights=int8"], {}, None,
        "device=cuda needs a CUDA GPU, and none is visible here: use device=cpu"),
       ("mcsd-eval", ["ckpt=EARLIER", "tasks=local", "device=cuda"], {}, None,
        "device=cuda needs a CUDA GPU, and none is visible here: use device=cpu"),
       ("mcsd-probe", ["context", "ckpt=EARLIER", "device=cuda"], {}, "mcsd-probe context",
        "device=cuda needs a CUDA GPU, and none is visible here: use device=cpu")] if not torch.cuda.is_available() else []),
    ("mcsd-plot", ["scaling", "source=logs", "fit=true", "samples=0"], {}, None,
     "samples=0 must be a positive number of bootstrap samples (e.g. samples=1000)"),
    ("mcsd-plot", ["ablation", "source=logs", "fit=true"], {}, None, "fit=true fits scaling laws: use it with mcsd-plot scaling"),
    # mcsd-plot is a Hydra app as every command: its old --options and a bare source are refused with the new spelling.
    ("mcsd-plot", ["ablation", "logs"], {}, None, "logs: mcsd-plot takes the folder or file to draw as a setting: source=logs"),
    ("mcsd-plot", ["ablation", "source=logs", "--name", "x"], {}, None,
     "--name: mcsd-plot takes settings as key=value, as every command: name=... (mcsd-plot --help lists them)"),
    ("mcsd-plot", [], {}, None, "name the figures first: mcsd-plot {inference,train,scaling,ablation,mqar,tasks,context,"
     "compare,experiment} source=..."),
    ("mcsd-plot", ["figures", "source=logs"], {}, None, "kind=figures is not a kind of figure: use one of inference, "),
    ("mcsd-plot", ["ablation", "source=logs", "nmae=x"], {}, None, "nmae=x: nmae is not a setting or group of mcsd-plot"),
    # Each of these said something else than what was wrong.
    ("mcsd-train", ["task=passkey"], {}, None, "task=passkey is a task of data=retrieval, and this run's data is a text "
     "corpus: add data=retrieval (or experiment=retrieval: every architecture on every task)"),
    ("mcsd-eval", ["ckpt=logs/nope", "tasks=local"], OFFLINE, None, "logs/nope does not exist: point to a model folder"),
    ("mcsd-eval", ["ckpt=garbage.ckpt", "tasks=local"], {}, None,  # left its run folder (its local tasks) before
     "garbage.ckpt is not a readable checkpoint (truncated or corrupt)"),
    ("mcsd-train", ["paths.output_dir=EARLIER"], {}, None, "holds a run already (checkpoints, model, csv, result.json): "
     "a new run there would mix its files with that run's; go on with that run (resume="),
    ("mcsd-train", ["-m", "model=mcsd,rnn"], {}, None,
     f"model=rnn is not an option of model: use one of {', '.join(sorted(registry.architectures()))}"),
    ("mcsd-bench", ["mode=serve"], {}, None, "mode='serve' is unknown"),
    ("mcsd-bench", ["inference.gen_lengths=[-128]"], {}, None,
     "inference.gen_lengths=[-128] must be whole numbers of at least 1"),
    ("mcsd-bench", ["inference.gen_lengths=[]"], {}, None,
     "inference.gen_lengths=[] measures nothing: give at least one value, e.g. inference.gen_lengths=[128]"),
    ("mcsd-bench", ["inference.batch_sizes=[0]"], {}, None, "inference.batch_sizes=[0] must be whole numbers of at least 1"),
    ("mcsd-bench", ["model_variant=slope_onyl"], {}, None, "model_variant=slope_onyl is a variant of no registered architecture: "
     "use one of full, slope_only"),
    ("mcsd-train", ["variant=slope_onyl"], {}, None, "variant=slope_onyl"),
    ("mcsd-bench", ["models=[]"], {}, None, "models=[] names no model: list some (models=[mcsd,transformer]) or "
     "models=null for every registered architecture"),
    ("mcsd-bench", ["mode=train", "train.seq_lens=[0,512]"], {}, None, "train.seq_lens=[0, 512] must be whole numbers"),
    ("mcsd-plot", ["inference", "source=neither.csv"], {}, None,
     "neither.csv is not an mcsd-bench inference results file: it lacks the columns model, batch, gen_len, status"),
    ("mcsd-plot", ["train", "source=neither.csv"], {}, None,
     "neither.csv is not an mcsd-bench train results file: it lacks the columns model, form, batch, seq_len, status"),
    ("mcsd-plot", ["inference", "source=errors.csv"], {}, None,
     "errors.csv has no measured point (status ok; it has 2 error): nothing to draw"),
    ("mcsd-plot", ["inference", "source=negative.csv"], {}, None, "negative.csv holds impossible points (gen_len=-128 in 1 of them)"),
    ("mcsd-bench", ["paths.log_dir=afile/logs"], {}, None, "paths.log_dir=afile/logs is not writable: "),
    ("mcsd-generate", [], {}, None, "ckpt is missing: give it on the command line"),
    ("mcsd-generate", ["ckpt=EARLIER", "dtype=float64"], {}, None,
     "dtype='float64' is not a dtype: use auto, float32, bfloat16, float16"),
    ("mcsd-eval", ["ckpt=EARLIER", "tasks=local", "dtype=half"], {}, None, "dtype='half' is not a dtype: use auto"),
    ("mcsd-eval", ["tasks=local"], {}, None, "ckpt is missing: give it on the command line"),
    ("mcsd-eval", ["ckpt=EARLIER", "tasks=table2"], OFFLINE, None,
     "task arc_challenge downloads its data from the Hugging Face Hub, which is unreachable from here: evaluate "
     "local task YAMLs with include_path=DIR"),
    ("mcsd-eval", ["ckpt=EARLIER", "tasks=[no_such_task]"], {}, None, "tasks: no_such_task is not an lm-eval task"),
    ("mcsd-plot", ["inference", "source=nothing.csv"], {}, None, "nothing.csv does not exist"),
    ("mcsd-plot", ["inference", "source=logs"], {}, None, "logs is a folder without a results.csv: give the results.csv "
     "(or the output_dir) of an mcsd-bench run; a training sweep's folder is drawn by mcsd-plot scaling|ablation"),
    ("mcsd-plot", ["experiment", "source=logs"], {}, None, "is not a result folder of a known experiment: give "
     "experiments/<experiment>/<name> with <experiment> one of fig4_scaling, "),
    ("mcsd-plot", ["ablation", "source=logs", "out=afile/figures"], {}, None, "out=afile/figures is not writable: "),
    ("mcsd-plot", ["ablation", "wandb=me/mcsd", "group=g"], NO_WANDB_KEY, None,
     "wandb uses W&B online but no W&B API key is set"),
    ("mcsd-export", ["ckpt=EARLIER", "out=afile/exported"], {}, None, "out=afile/exported is not writable: "),
    # Each of these deleted files before: the working folder, every run, a user's notes.
    ("mcsd-export", ["ckpt=EARLIER", "out=.", "overwrite=true"], {}, None, "out=. holds the model being exported ("),
    ("mcsd-export", ["ckpt=EARLIER", "out=logs", "overwrite=true"], {}, None, "out=logs holds the model being exported"),
    ("mcsd-export", ["ckpt=EARLIER", "out=notes", "overwrite=true"], {}, None,
     "out=notes holds what an export does not write (notes.txt): choose a new or empty folder (overwrite=true "
     "replaces only an earlier export)"),
    ("mcsd-train", ["flush_denormal=maybe"], {}, None, "flush_denormal=maybe must be true or false"),
    ("mcsd-probe", [], {}, None, "name a probe first: mcsd-probe {context} ckpt=RUN"),
    ("mcsd-probe", ["context", "ckpt=EARLIER", "windows=[0]"], {}, "mcsd-probe context",
     "windows=[0] must be positive token counts"),
    ("mcsd-probe", ["context", "ckpt=EARLIER", "dtype=fp8"], {}, "mcsd-probe context", "dtype='fp8' is not a dtype"),
]


def _runs(cwd: Path) -> list[Path]:
    return sorted(cwd.glob("logs/*/*runs/*"))


def _folders(cwd: Path) -> list[Path]:
    """Every folder under the working folder but the Hugging Face cache's and lm-eval's inner ones."""
    return sorted(path for path in cwd.rglob("*") if path.is_dir() and "hf" not in path.relative_to(cwd).parts)


@pytest.mark.slow
@pytest.mark.parametrize(("app", "arguments", "env", "label", "message"), BAD_INPUTS,
                         ids=[f"{case[0]} {' '.join(case[1])}".strip() for case in BAD_INPUTS])
def test_every_bad_input_fails_in_one_line(
    earlier_run: tuple[Path, dict[str, str]], bad_inputs: Path, monkeypatch: pytest.MonkeyPatch, app: str,
    arguments: list[str], env: dict[str, str | None], label: str | None, message: str
) -> None:
    """Through the command's own entry point (this process; the case below runs the installed
    command itself): exit status 2, one line naming the setting, no traceback, no run folder
    left behind, the earlier run untouched."""
    cwd, before = earlier_run
    monkeypatch.chdir(cwd)
    (earlier,) = (cwd / "logs" / "train" / "runs").iterdir()
    runs, folders = _runs(cwd), _folders(cwd)
    arguments = [argument.replace("EARLIER", str(earlier)) for argument in arguments]
    result = run_here(app, *(FAST if app == "mcsd-train" else []), *arguments, env=env)
    errors = [line for line in result.stderr.splitlines() if line.startswith(f"{label or app}: error:")]
    assert result.returncode == 2 and len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "Error executing job" not in result.stderr
    assert _runs(cwd) == runs and _snapshot(earlier) == before
    added = sorted(set(_folders(cwd)) - set(folders))  # no empty logs/<task>/runs, no cache folder of a refused corpus
    assert not added, added
    assert (cwd / "notes" / "notes.txt").is_file() and (cwd / "afile").is_file()
    for earlier_results in ("earlier_bench", "earlier_eval", "earlier_probe"):
        for file in (cwd / earlier_results).iterdir():
            assert file.read_text() == f"the earlier run's {file.name}\n"


def test_the_projects_error_inside_hydras_wrappers_is_its_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """An MCSDError that a config object raises while Hydra instantiates it reaches the user as
    its own line, however many of Hydra's InstantiationExceptions wrap it; anything else stays
    a traceback."""
    def instantiate_twice_wrapped() -> None:
        try:
            try:
                raise MCSDError("data.seq_len=0 must be a positive whole number")
            except MCSDError as error:
                raise InstantiationException("Error in call to target 'Data': full_key: data") from error
        except InstantiationException as error:
            raise InstantiationException("Error in call to target 'Outer'") from error

    with pytest.raises(SystemExit) as exit_info:
        run_or_exit("mcsd-train", instantiate_twice_wrapped)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "mcsd-train: error: data.seq_len=0 must be a positive whole number\n"
    with pytest.raises(InstantiationException):
        run_or_exit("mcsd-train", lambda: (_ for _ in ()).throw(InstantiationException("not ours")))


def test_a_refused_run_in_a_users_folder_removes_none_of_its_files(tmp_path: Path) -> None:
    """hydra.run.dir naming a user's folder that holds only a .log file of theirs: the refused run
    cleans up after itself without taking that file (any *.log counted as Hydra's before)."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.log").write_text("a user's own log\n")
    result = run_here("mcsd-train", *FAST, "hydra.run.dir=mine", "optimizer.lr=-1e-3", cwd=tmp_path)
    assert result.returncode == 2 and "optimizer.lr=-0.001 must be 0 or more" in result.stderr
    assert (folder / "notes.log").read_text() == "a user's own log\n"


def test_a_refused_command_in_a_fresh_folder_leaves_nothing_there(tmp_path: Path) -> None:
    """The first command in a new folder, refused, left an empty logs/ behind; one in a folder whose
    logs/ was there before keeps that folder."""
    result = run_here("mcsd-train", *FAST, "optimizer.lr=-1e-3", cwd=tmp_path)
    assert result.returncode == 2 and "optimizer.lr=-0.001 must be 0 or more" in result.stderr
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "logs").mkdir()
    assert run_here("mcsd-train", *FAST, "optimizer.lr=-1e-3", cwd=tmp_path).returncode == 2
    assert [path.name for path in tmp_path.rglob("*")] == ["logs"]


def test_a_file_this_user_may_not_use_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A PermissionError anywhere in a command (a file it may not read or write) ends it in one
    line naming the file (as root, chmod cannot make a file unreadable, so it is raised here)."""
    def read_a_protected_file() -> None:
        raise PermissionError(13, "Permission denied", "/data/secret.txt")

    with pytest.raises(SystemExit) as exit_info:
        run_or_exit("mcsd-train", read_a_protected_file)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == ("mcsd-train: error: /data/secret.txt cannot be used: Permission denied (this "
                                       "user's rights): change its permissions (chmod) or use another\n")


@pytest.mark.slow
def test_the_installed_command_ends_a_bad_input_in_one_line(earlier_run: tuple[Path, dict[str, str]]) -> None:
    """The table above through the installed command itself, for one case of each kind: a bad
    option refused before Hydra starts, and a setting refused once the run has its folder."""
    cwd, before = earlier_run
    (earlier,) = (cwd / "logs" / "train" / "runs").iterdir()
    for arguments, message in [(["size=huge"], "size=huge is not an option of size"),
                               (["optimizer.lr=-1e-3"], "optimizer.lr=-0.001 must be 0 or more")]:
        result = run_cli("mcsd-train", *FAST, *arguments, cwd=cwd)
        errors = [line for line in result.stderr.splitlines() if line.startswith("mcsd-train: error:")]
        assert result.returncode == 2 and len(errors) == 1 and message in errors[0], result.stderr[-2000:]
        assert "Traceback" not in result.stderr
        assert list((cwd / "logs" / "train" / "runs").iterdir()) == [earlier] and _snapshot(earlier) == before


@pytest.mark.slow
def test_one_text_file_trains_in_one_command(tmp_path: Path) -> None:
    """``mcsd-train data=text_files data.paths=FILE trainer.max_steps=20``, nothing else: the file is
    cut into its paragraphs (validation and test documents held out of them), the warm-up is a
    tenth of the run (2 steps: the first step's learning rate is half the base's), and the run ends
    with its validation and test perplexities, each naming its split, as the CSV logged them."""
    words = ["the", "king", "of", "a", "far", "land", "rode", "out", "at", "dawn", "and", "sang"]
    paragraphs = [" ".join(words[(index * 7 + offset) % len(words)] for offset in range(60)) for index in range(80)]
    (tmp_path / "mytext.txt").write_text("\n\n".join(paragraphs) + "\n")
    result = run_here("mcsd-train", "data=text_files", "data.paths=mytext.txt", "size=tiny", "trainer.max_steps=20",
                      "data.seq_len=32", "data.batch_size=4", "logger=csv", "callbacks.progress_bar.refresh_rate=0",
                      "trainer.log_every_n_steps=1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    rows = read_metrics(run)
    assert float(next(row["lr-AdamW/pg1"] for row in rows if row.get("lr-AdamW/pg1"))) == pytest.approx(4e-4)
    val_ppl = float([row["val/ppl"] for row in rows if row.get("val/ppl")][-1])
    test_ppl = float(next(row["test/ppl"] for row in rows if row.get("test/ppl")))
    lines = result.stdout.splitlines()
    assert any(line.startswith(f"final validation perplexity: {val_ppl:.2f} ") and line.endswith(
        "on the val split (5 documents held out of training)") for line in lines), result.stdout[-2000:]
    assert any(line.startswith(f"final test perplexity: {test_ppl:.2f} ") and line.endswith(
        "on the test split (5 documents held out of training)") for line in lines), result.stdout[-2000:]
    # Lightning's summary counts FLOPs only of an example input: here the model's own, of one batch's forward.
    flops = mcsd.load(run).forward_flops(4, 32)
    assert flops > 0 and f"Total FLOPs: {get_human_readable_count(flops)}" in result.stdout


def test_every_setting_that_cannot_work_is_named_in_one_pass(tmp_path: Path) -> None:
    """Three mistakes at once: a line each, in one try (not one refusal per try), exit status 2."""
    result = run_here("mcsd-train", *FAST, "optimizer.lr=-1", "scheduler.warmup_steps=50", "compile=maybe", cwd=tmp_path)
    errors = [line for line in result.stderr.splitlines() if line.startswith("mcsd-train: error: ")]
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert [line.split(": error: ")[1].split(" ")[0] for line in errors] == [
        "compile=maybe", "optimizer.lr=-1", "scheduler.warmup_steps=50"], result.stderr[-2000:]
    assert not (tmp_path / "logs" / "train" / "runs").exists() or not any((tmp_path / "logs" / "train" / "runs").iterdir())


@pytest.mark.slow
def test_help_lists_the_groups_a_user_chooses_from_and_the_main_settings(tmp_path: Path) -> None:
    """``--help``: the command's own usage, each group with its options (the registry's models among
    them) and default, the main settings with their defaults and comments; no internal group
    (``_common``) and none of Hydra's own."""
    result = run_here("mcsd-train", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("mcsd-train: ")
    assert f"  model={'|'.join(sorted(registry.architectures()))}  (default: mcsd)" in lines
    ablations = sorted(registry.get("mcsd").variants)
    assert {"full", "slope_only", "double_decay", "sum_fusion", "short_conv", "hybrid_attention"} <= set(ablations)
    assert f"  ablation={'|'.join(ablations)}  (default: none)" in lines
    variants = sorted({variant for name in registry.architectures() for variant in registry.get(name).variants})
    assert f"  variant={'|'.join(variants)}  (default: none)" in lines
    assert any(line.startswith("  test_after_training=true  (evaluate the test split") for line in lines)
    assert "_common" not in result.stdout and "hydra/" not in result.stdout and "Hydra" not in result.stdout
    assert list(tmp_path.iterdir()) == []  # --help writes nothing


def test_a_run_that_tests_nothing_holds_out_no_test_documents_beside_named_val_files(tmp_path: Path) -> None:
    """``data.paths={train:[...],val:[...]}`` with ``test_after_training=false``: every training
    document is trained on (no test documents held out); with a test run, the test documents are."""
    from hydra import compose, initialize_config_module
    from hydra.core.hydra_config import HydraConfig

    from mcsd.training.run import _hold_out_only_what_is_run

    (tmp_path / "a.txt").write_text("\n\n".join(f"paragraph {index} " * 30 for index in range(40)))
    (tmp_path / "b.txt").write_text("\n\n".join(f"held out {index} " * 30 for index in range(25)))
    paths = f"data.paths={{train:[{tmp_path / 'a.txt'}],val:[{tmp_path / 'b.txt'}]}}"
    built = {}
    for tested in (True, False):
        with initialize_config_module("mcsd.conf", version_base="1.3"):
            cfg = compose("train", overrides=["data=text_files", paths, f"test_after_training={tested}", "size=tiny",
                                              "data.seq_len=32", f"paths.cache_dir={tmp_path / 'cache'}"],
                          return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        _hold_out_only_what_is_run(cfg)
        data = hydra.utils.instantiate(cfg.data)
        splits = data.build()
        built[tested] = (splits["train"].documents, splits["val"].documents, splits["test"].documents)
    assert built[False] == (40, 25, 0) and built[True][0] < 40 and built[True][1:] == (25, 40 - built[True][0])


# A sweep whose jobs diverge first, in the middle and last, with a refused job among them: every job runs.
SWEEP_ENDS = [("1e6", "diverged"), ("1e-3", "finished"), ("2e6", "diverged"), ("-1", "refused"), ("2e-3", "finished"),
              ("3e6", "diverged")]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "local_parallel"])
def test_a_sweep_runs_every_job_and_reports_how_each_ended(tmp_path: Path, launcher: str) -> None:
    """One diverging or refused job ended the sweep (the jobs after it never ran, no summary, and
    under local_parallel a diverging job killed its healthy sibling). Now every job runs, each
    healthy one to its model, the summary says how each ended, and the command exits 2."""
    lrs = ",".join(lr for lr, _ in SWEEP_ENDS)
    result = run_here("mcsd-train", "-m", f"hydra/launcher={launcher}", f"optimizer.lr={lrs}", *FAST, "logger=csv",
                      "test_after_training=false", "callbacks.model_checkpoint.every_n_train_steps=1", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    (sweep,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    lines = result.stdout.strip().splitlines()
    start = lines.index(f"sweep: {sweep} ({len(SWEEP_ENDS)} jobs)")
    for job, (lr, end) in enumerate(SWEEP_ENDS):
        folder = sweep / str(job)
        ended = json.loads((folder / "result.json").read_text())
        assert ended["status"] == end, (job, ended)
        line = lines[start + 1 + job]
        typed = lr if lr.lstrip("-").isdigit() else repr(float(lr))  # as Hydra writes the job's override
        assert line.startswith(f"  job {job}: optimizer.lr={typed}: "), line
        if end == "finished":
            assert (folder / "model" / "model.safetensors").is_file() and (folder / "checkpoints" / "last.ckpt").is_file()
            assert line.endswith(f"val ppl {ended['val_ppl']:.2f}")
        elif end == "diverged":
            assert line.endswith(f"diverged at step {ended['diverged_at_step']} (no result)")
            assert not (folder / "model").exists()
        else:
            assert line.endswith("refused: optimizer.lr=-1 must be 0 or more (the paper's 8e-4 is the default)"), line
    errors = [line for line in result.stderr.splitlines() if line.startswith("mcsd-train: error:")]
    assert len(errors) == (4 if launcher == "basic" else 0), errors  # each said why in its line (a worker: its own stderr)
    assert result.stderr.strip().splitlines()[-1] == (
        "sweep: 4 of 6 jobs did not finish (job 0 diverged, job 2 diverged, job 3 refused, job 5 diverged)")


def test_a_job_that_fails_with_an_error_of_ours_does_not_stop_the_sweep(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that ends in a traceback (a bug) prints it, records it, and the next job runs."""
    import mcsd.training.run as train_command

    trained = train_command.train

    def a_bug_at_the_first_rate(cfg):
        if cfg.optimizer.lr == 1e-3:
            raise RuntimeError("a bug")
        return trained(cfg)

    monkeypatch.setattr(train_command, "train", a_bug_at_the_first_rate)
    result = run_here("mcsd-train", "-m", "optimizer.lr=1e-3,2e-3", *QUICK, "logger=csv", cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "RuntimeError: a bug" in result.stderr and "Traceback" in result.stderr
    (sweep,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    assert json.loads((sweep / "0" / "result.json").read_text()) == {
        "status": "failed", "reason": "RuntimeError: a bug (the traceback is in this job's output)"}
    assert json.loads((sweep / "1" / "result.json").read_text())["status"] == "finished"
    assert "  job 0: optimizer.lr=0.001: failed: RuntimeError: a bug (the traceback is in this job's output)" in (
        result.stdout.splitlines())


@pytest.mark.slow
def test_overwrite_true_replaces_an_earlier_grids_results_and_resume_keeps_them(tmp_path: Path) -> None:
    """mcsd-bench into a folder of earlier results: refused by default (the earlier rows stay),
    overwrite=true replaces them with this grid's alone, resume=true keeps them and adds its own."""
    grid = ["model_size=tiny", "inference.gen_lengths=[4]", "inference.batch_sizes=[1]", "inference.prompt_len=8",
            "inference.repeats=1", "inference.warmup=0", "wandb.enabled=false", "output_dir=grid"]

    def models() -> list[str]:
        return [line.split(",")[0] for line in (tmp_path / "grid" / "results.csv").read_text().splitlines()[1:]]

    assert run_here("mcsd-bench", "models=[mcsd,transformer]", *grid, cwd=tmp_path).returncode == 0
    refused = run_here("mcsd-bench", "models=[retnet]", *grid, cwd=tmp_path)
    assert refused.returncode == 2 and models() == ["mcsd", "transformer"]
    assert run_here("mcsd-bench", "models=[retnet]", *grid, "resume=true", cwd=tmp_path).returncode == 0
    assert models() == ["mcsd", "transformer", "retnet"]
    replaced = run_here("mcsd-bench", "models=[retnet]", *grid, "overwrite=true", cwd=tmp_path)
    assert replaced.returncode == 0 and models() == ["retnet"]


def test_an_interrupted_job_stops_its_sweep_with_the_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job stopped by a signal (its checkpoint written, as mcsd-train does) stops the sweep: its
    result says so, the summary is printed, the jobs after it do not start, the exit status is the job's."""
    import mcsd.training.run as train_command

    def stopped_by_sigterm(cfg):
        raise SystemExit(143)

    monkeypatch.setattr(train_command, "train", stopped_by_sigterm)
    result = run_here("mcsd-train", "-m", "optimizer.lr=1e-3,2e-3", *QUICK, "logger=csv", cwd=tmp_path)
    assert result.returncode == 143, result.stderr[-3000:]
    (sweep,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    assert [job.name for job in sweep.iterdir() if job.is_dir()] == ["0"]
    assert json.loads((sweep / "0" / "result.json").read_text()) == {
        "status": "interrupted", "reason": "stopped by SIGTERM (exit status 143)"}
    assert "  job 0: (the sweep's settings): interrupted: stopped by SIGTERM (exit status 143)" in result.stdout.splitlines()
    assert result.stderr.strip().splitlines()[-2:] == [
        "mcsd-train: the sweep stops at its interrupted job 0: the jobs after it do not start",
        "sweep: 1 of 1 jobs did not finish (job 0 interrupted)"]


def test_a_refused_sweep_in_a_users_folder_removes_only_what_it_wrote(tmp_path: Path) -> None:
    """hydra.sweep.dir naming a user's folder, every job refused: the jobs' folders and multirun.yaml
    go, the user's file stays; in a folder of its own the sweep leaves nothing."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's notes\n")
    result = run_here("mcsd-train", "-m", *FAST, "optimizer.lr=-1,-2", "hydra.sweep.dir=mine", cwd=tmp_path)
    errors = [line for line in result.stderr.splitlines() if line.startswith("mcsd-train: error:")]
    assert result.returncode == 2 and len(errors) == 2, result.stderr[-2000:]
    assert [path.name for path in (tmp_path / "mine").iterdir()] == ["notes.txt"]
    assert run_here("mcsd-train", "-m", *FAST, "optimizer.lr=-1,-2", cwd=tmp_path).returncode == 2
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mine"]
