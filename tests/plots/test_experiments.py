"""The paper's training experiments: sweeps compose and run, figures and tables come out
of their logs, and the figures notebook executes."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
import yaml

from helpers import ROOT, FIXTURES
from helpers.runs import TINY_SWEEP, sweep_dir, run_here
from mcsd.checkpoint.lightning_checkpoint import read_checkpoint
from mcsd.errors import MCSDError
from mcsd.models import registry
from mcsd.models.mcsd import MCSDConfig
from mcsd.commands.plot import main as plot_main
from mcsd.plots.experiments import DRAWINGS, result_folders
from mcsd.plots.runs import load_csv_runs, load_wandb_runs, markdown_seed_table, plot_sweep, seed_table

NOTEBOOK = ROOT / "notebooks" / "figures.ipynb"
ABLATION_LABELS = ["MCSD full", "MCSD slope_only", "MCSD decay_only", "MCSD double_slope", "MCSD double_decay",
                   "Transformer"]
EXPERIMENTS = ROOT / "experiments"
LEGACY_LOGS = FIXTURES / "legacy_fig9_logs"


@pytest.fixture(scope="module")
def ablation_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("fig9")
    result = run_here("mcsd-train", "-m", "experiment=fig9_ablation", "size=tiny", *TINY_SWEEP, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return sweep_dir(cwd)


@pytest.fixture(scope="module")
def scaling_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("fig4")
    result = run_here("mcsd-train", "-m", "experiment=fig4_scaling", "size=tiny,small", "seed=0,1", *TINY_SWEEP,
                     cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return sweep_dir(cwd)


@pytest.mark.slow
def test_ablation_experiment_sweeps_every_variant_and_the_transformer(ablation_sweep: Path) -> None:
    """Its arms: the five MCSD variants, then the Transformer (not an ablation option)."""
    jobs = sorted((path for path in ablation_sweep.iterdir() if path.is_dir()), key=lambda path: int(path.name))
    assert len(jobs) == 6
    for job in jobs:  # each job writes its own logs and model
        assert (job / "csv" / "version_0" / "metrics.csv").is_file() and (job / "model" / "config.json").is_file()
    models = [json.loads((job / "model" / "config.json").read_text())["_target_"].rsplit(".", 1)[1] for job in jobs]
    assert models == ["MCSDConfig"] * 5 + ["TransformerConfig"]
    sections = [json.loads((job / "model" / "config.json").read_text()).get("sections") for job in jobs[:5]]
    assert sections == [["slope", "decay"], ["slope"], ["decay"], ["slope", "slope"], ["decay", "decay"]]


@pytest.mark.slow
def test_ablation_figure_has_a_curve_per_variant(ablation_sweep: Path, tmp_path: Path) -> None:
    # Directory names carry no meaning: shuffle them and the figure must not change.
    shuffled = tmp_path / "runs"
    for index, job in enumerate(sorted(p for p in ablation_sweep.iterdir() if p.is_dir())):
        shutil.copytree(job / "csv", shuffled / f"job-{(index * 7) % 6}" / "csv")
    figure = plot_sweep("ablation", load_csv_runs(shuffled), tmp_path / "figure")
    assert figure.labels == ABLATION_LABELS
    assert [path.name for path in figure.paths] == ["fig9_ablation.png", "fig9_ablation.pdf",
                                                    "fig9_ablation_table.md"]
    assert all(path.stat().st_size > 1000 for path in figure.paths[:2])
    assert figure.title == "fig9 ablation"  # the runs' experiment names the figure
    assert plot_sweep("ablation", load_csv_runs(shuffled).assign(experiment=""), tmp_path / "other").title == (
        "ablation sweep")  # a sweep of no experiment is not called Fig. 9
    assert list(figure.table["curve"]) == ABLATION_LABELS and (figure.table["tokens"] == 384).all()
    table = figure.paths[2].read_text()
    assert table.count("\n") == 2 + 6 and "| MCSD full | 1 | 384 |" in table
    hparams = yaml.safe_load((ablation_sweep / "5" / "csv" / "version_0" / "hparams.yaml").read_text())
    assert (hparams["model/arch"], hparams["model/variant"], hparams["choices"]["ablation"]) == (
        "transformer", "default", None)


def test_arms_cannot_also_be_overridden(tmp_path: Path) -> None:
    result = run_here("mcsd-train", "-m", "experiment=fig9_ablation", "model=transformer", *TINY_SWEEP, cwd=tmp_path)
    assert result.returncode != 0
    assert "hydra.sweeper.arms sets model=mcsd but that key is also overridden" in result.stderr


def test_logs_written_before_the_registry_still_group(tmp_path: Path) -> None:
    """Fig. 9 logs of the first CPU sweep (tests/fixtures/legacy_fig9_logs/, from Tiny Shakespeare)
    name the old config paths, an ablation=transformer_baseline run and no decay settings: they
    group by the architecture and variant they logged all the same, and the variants with a
    decay section are named by the gain they were made with (1.0, today's legacy value)."""
    rows = load_csv_runs(LEGACY_LOGS)
    figure_labels = plot_sweep("ablation", rows, tmp_path).labels
    assert figure_labels == ["MCSD full, decay_norm_gain_init=1.0", "MCSD slope_only",
                             "MCSD decay_only, decay_norm_gain_init=1.0", "MCSD double_slope",
                             "MCSD double_decay, decay_norm_gain_init=1.0", "Transformer"]


def plot_here(monkeypatch: pytest.MonkeyPatch, *argv: str) -> None:
    """``mcsd-plot ARGV`` in this process (its Hydra app reads ``sys.argv``)."""
    monkeypatch.setattr(sys, "argv", ["mcsd-plot", *argv])
    plot_main()


def test_plot_cli_takes_its_settings_in_any_order(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """As experiments/sweep.sh calls it: ``mcsd-plot ablation reference=CURVE source=DIR name=NAME``."""
    plot_here(monkeypatch, "ablation", "reference=Transformer", f"source={LEGACY_LOGS}", "name=study", f"out={tmp_path}")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["study.pdf", "study.png", "study_by_seed.md",
                                                                "study_table.md"]
    assert "| Transformer | 118.5 | 118.5 | +0.0% (+0.0% to +0.0%) |" in capsys.readouterr().out


def test_runs_are_labelled_by_the_decay_settings_in_effect() -> None:
    """A setting is named only where it changes the model; a logged node without a setting
    (written before it existed) takes the value runs used then."""
    mcsd_arch = registry.get("mcsd")
    node = {"sections": ["slope", "decay"], "decay_norm": "rmsnorm"}
    assert mcsd_arch.variant_of({**node, "decay_norm_gain_init": 0.3}) == "full, decay_norm_gain_init=0.3"
    assert mcsd_arch.variant_of({**node, "decay_norm": "sum", "decay_norm_gain_init": 0.3}) == "full, decay_norm=sum"
    assert mcsd_arch.variant_of({"sections": ["slope"], "decay_norm_gain_init": 0.3}) == "slope_only"
    assert mcsd_arch.variant_of({"sections": ["decay"], "fusion": "concat"}) == "decay_only, decay_norm_gain_init=1.0"
    assert mcsd_arch.variant_of({**node, "decay_norm_gain_init": MCSDConfig.decay_norm_gain_init}) == "full"


def seed_rows(values: dict[tuple[str, int], float]) -> pd.DataFrame:
    """Logged rows with one final val/ppl (and val/loss) per (architecture, seed)."""
    return pd.DataFrame([{"run": f"{arch}-{seed}", "metric": metric, "tokens": 100.0, "value": value,
                          "arch": arch, "size": "small", "data": "",
                          "variant": registry.get(arch).variant_of(registry.field_defaults(registry.get(arch).config_class)),
                          "seed": seed, "params": 1e6}
                         for (arch, seed), ppl in values.items()
                         for metric, value in (("val/ppl", ppl), ("val/loss", math.log(ppl)))])


def test_seed_table_pairs_each_curve_with_the_reference_by_seed(tmp_path: Path) -> None:
    rows = seed_rows({("mcsd", 0): 110.0, ("mcsd", 1): 90.0, ("transformer", 0): 100.0, ("transformer", 1): 100.0})
    table = seed_table("ablation", rows, reference="Transformer")
    assert list(table.index) == ["MCSD full", "Transformer"]
    assert table.loc["MCSD full", ["seed 0", "seed 1", "mean"]].tolist() == [110.0, 90.0, 100.0]
    assert table.loc["MCSD full", ["ratio", "ratio_min", "ratio_max"]].tolist() == pytest.approx([1.0, 0.9, 1.1])
    assert "| MCSD full | 110.0 | 90.0 | 100.0 | +0.0% (-10.0% to +10.0%) |" in markdown_seed_table(table)
    figure = plot_sweep("ablation", rows, tmp_path, name="study", reference="Transformer")
    assert [path.name for path in figure.paths] == ["study.png", "study.pdf", "study_table.md", "study_by_seed.md"]
    with pytest.raises(MCSDError, match="reference='RWKV' is not a curve of this sweep: use one of MCSD full, "):
        seed_table("ablation", rows, reference="RWKV")


def test_runs_that_differ_in_their_documents_setting_are_curves_of_their_own(tmp_path: Path) -> None:
    """A sweep over ``data.documents``: a curve per architecture and setting, named by it; a sweep
    with one setting (every committed one) keeps its labels."""
    values = {("mcsd", 0): 110.0, ("transformer", 0): 100.0}
    joined, apart = seed_rows(values).assign(documents="joined"), seed_rows({**values}).assign(documents="apart")
    rows = pd.concat([joined, apart.assign(run=apart["run"] + "-apart", value=apart["value"] * 0.5)], ignore_index=True)
    figure = plot_sweep("ablation", rows, tmp_path)
    assert figure.labels == ["MCSD full, documents joined", "MCSD full, documents apart",
                             "Transformer, documents joined", "Transformer, documents apart"]
    assert figure.table.loc[figure.table["curve"] == "MCSD full, documents apart", "val_ppl"].item() == 55.0
    assert plot_sweep("ablation", joined, tmp_path / "one").labels == ["MCSD full", "Transformer"]
    # Paired with the reference of its own documents setting (and seed).
    table = seed_table("ablation", rows, reference="Transformer")
    assert table["ratio"].tolist() == pytest.approx([1.1, 1.1, 1.0, 1.0])


@pytest.mark.slow
def test_scaling_cli_draws_sizes_and_models_over_seeds(scaling_sweep: Path, tmp_path: Path) -> None:
    result = run_here("mcsd-plot", "scaling", f"source={scaling_sweep}", f"out={tmp_path}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "fig4_scaling.png").is_file() and (tmp_path / "fig4_scaling_table.md").is_file()
    rows = load_csv_runs(scaling_sweep)
    figure = plot_sweep("scaling", rows, tmp_path)
    assert figure.labels == ["MCSD tiny (0.6M)", "MCSD small (1.8M)", "Transformer tiny (0.6M)",
                             "Transformer small (1.8M)"]  # equal size: the Transformer's MLP is narrower
    assert (figure.table["seeds"] == 2).all()
    assert "| MCSD tiny (0.6M) | 2 | 384 |" in result.stdout  # one vocabulary (4096) for all sizes
    # fit=true: the laws' table printed and written, their draws saved beside the figure
    fitted = run_here("mcsd-plot", "scaling", f"source={scaling_sweep}", f"out={tmp_path}", "fit=true", "samples=5",
                      cwd=tmp_path)
    assert fitted.returncode == 0, fitted.stderr
    assert (tmp_path / "fig4_scaling_fit.md").read_text() in fitted.stdout
    saved = json.loads((tmp_path / "fig4_scaling_fit_draws.json").read_text())
    assert saved["key"]["samples"] == 5 and sorted(saved["architectures"]) == ["mcsd", "transformer"]


class FakeRun:
    """What the W&B API gives for one run: its config and its logged history."""

    def __init__(self, job: Path) -> None:
        import yaml

        self.id = job.name
        self.config = yaml.safe_load((job / "csv" / "version_0" / "hparams.yaml").read_text())
        self._history = pd.read_csv(job / "csv" / "version_0" / "metrics.csv").rename(columns={"step": "_step"})

    def scan_history(self):
        for record in self._history.to_dict("records"):
            yield {key: value for key, value in record.items() if pd.notna(value)}


@pytest.mark.slow
def test_wandb_source_gives_the_same_curves(scaling_sweep: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wandb

    jobs = sorted(p for p in scaling_sweep.iterdir() if p.is_dir())
    asked = {}

    class FakeApi:
        def runs(self, path: str, filters: dict) -> list[FakeRun]:
            asked.update(path=path, filters=filters)
            return [FakeRun(job) for job in jobs]

    monkeypatch.setattr(wandb, "Api", FakeApi)
    from_wandb = load_wandb_runs("me/mcsd", "fig4_scaling")
    assert asked == {"path": "me/mcsd", "filters": {"group": "fig4_scaling", "state": "finished"}}
    from_csv = load_csv_runs(scaling_sweep)
    key = ["metric", "arch", "variant", "size", "seed", "tokens"]
    assert from_wandb.sort_values(key)[key + ["value"]].reset_index(drop=True).equals(
        from_csv.sort_values(key)[key + ["value"]].reset_index(drop=True))


def test_plot_errors_are_one_line(tmp_path: Path) -> None:
    empty = run_here("mcsd-plot", "ablation", f"source={tmp_path}", cwd=tmp_path)
    assert empty.returncode == 2 and "holds no run logs" in empty.stderr
    no_group = run_here("mcsd-plot", "scaling", "wandb=me/mcsd", cwd=tmp_path)
    assert no_group.returncode == 2 and "wandb=ENTITY/PROJECT needs group=" in no_group.stderr


def test_committed_notebook_has_no_outputs() -> None:
    nbformat = pytest.importorskip("nbformat", reason="the notebook's tests need nbformat (the dev extra)")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


def _matplotlib_of(png: Path) -> str:
    """The matplotlib version a PNG was drawn with (its Software text chunk)."""
    from PIL import Image

    return Image.open(png).text.get("Software", "")


@pytest.mark.slow
def test_notebook_rewrites_the_committed_results_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The notebook, executed over a copy of the committed results (what a clone has: no logs/,
    no trial/), writes every figure and table the experiments' run.sh scripts wrote, unchanged,
    and no other file; it shows each one. Figures are compared byte for byte when this matplotlib
    is the one that drew the committed ones (another version draws other bytes), tables always."""
    experiments = tmp_path / "experiments"
    shutil.copytree(EXPERIMENTS, experiments, ignore=shutil.ignore_patterns("logs", "trial"))
    before = {path.relative_to(experiments): path.read_bytes() for path in experiments.rglob("*") if path.is_file()}
    (experiments / "table2_downstream" / "tiny").mkdir()  # Table 2 has no committed result: one made here
    (experiments / "table2_downstream" / "tiny" / "results.json").write_text(json.dumps(
        {"params": 164288, "results": {"arc_easy": {"acc,none": 0.3, "acc_norm,none": 0.35}}}))
    monkeypatch.setenv("MCSD_EXPERIMENTS", str(experiments))
    nbformat = pytest.importorskip("nbformat", reason="the notebook's tests need nbformat (the dev extra)")
    NotebookClient = pytest.importorskip("nbclient", reason="the notebook's tests need nbclient").NotebookClient
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    after = {path.relative_to(experiments) for path in experiments.rglob("*") if path.is_file()}
    assert sorted(map(str, after - set(before))) == ["table2_downstream/tiny/results.json"]
    same_matplotlib = _matplotlib_of(EXPERIMENTS / "fig9_ablation" / "tinyshakespeare" / "fig9_ablation.png") == (
        f"Matplotlib version{matplotlib.__version__}, https://matplotlib.org/")
    # A scaling fit's tables and figures too: drawn from its saved bootstrap draws (`*_fit_draws.json`),
    # whose refit would land on CPU-dependent last digits (tests/plots/test_scaling_fit.py refits).
    assert sorted(str(path) for path in before if path.name.endswith("_fit_draws.json")) == [
        "fig4_scaling/embedded/fig4_scaling_fit_draws.json", "fig4_scaling/tinyshakespeare/fig4_scaling_fit_draws.json"]
    compared = [path for path in before if same_matplotlib or path.suffix not in (".png", ".pdf")]
    changed = [str(path) for path in compared if (experiments / path).read_bytes() != before[path]]
    assert changed == []
    images = sum(1 for cell in notebook.cells for output in cell.get("outputs", [])
                 if "image/png" in output.get("data", {}))
    assert images == sum(len(list(folder.glob("*.png"))) for experiment in DRAWINGS
                         for folder in result_folders(EXPERIMENTS, experiment))  # each committed figure, shown
    markdown = "".join(output["data"].get("text/markdown", "") for cell in notebook.cells
                       for output in cell.get("outputs", []) if "data" in output)
    assert "| **tiny** (ours, measured) | 0.2M | - | 35.0 | - | - | - | - |" in markdown  # Table 2
    for table in ("mqar_converge/cpu/mqar_converge_table.md", "compare_architectures/tinyshakespeare/"
                  "architectures_compared_table.md", "fig9_ablation/tinyshakespeare/fig9_ablation_by_seed.md"):
        assert (EXPERIMENTS / table).read_text().splitlines()[2] in markdown  # shown as well as written


def test_plot_experiment_draws_a_result_folder_or_every_one_as_run_sh_does(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``mcsd-plot experiment`` (what every run.sh ends with) given an experiment's folder draws each
    of its result folders, given one result folder that one, the committed files unchanged."""
    experiment = tmp_path / "fig9_ablation"
    shutil.copytree(EXPERIMENTS / "fig9_ablation", experiment, ignore=shutil.ignore_patterns("logs", "trial"))
    tables = sorted(experiment.glob("*/*.md"))
    for table in tables:
        table.unlink()
    plot_here(monkeypatch, "experiment", f"source={experiment}")
    assert [table.read_text() for table in sorted(experiment.glob("*/*.md"))] == [
        (EXPERIMENTS / table.relative_to(tmp_path)).read_text() for table in tables]
    capsys.readouterr()
    plot_here(monkeypatch, "experiment", f"source={experiment / 'tinyshakespeare'}")
    printed = capsys.readouterr().out
    assert printed.startswith(f"{experiment / 'tinyshakespeare'}\n") and "vs Transformer" in printed
    assert "embedded" not in printed


def _sweep_env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "WANDB_MODE": "offline"}


@pytest.mark.parametrize("script", ["fig9_ablation/run.sh", "compare_architectures/run.sh", "long_context/run.sh",
                                    "rwkv_perspectives/run.sh", "wm_ablation/run.sh", "documents_apart/run.sh"])
def test_an_experiment_given_no_corpus_prints_its_usage_and_starts_nothing(script: str, tmp_path: Path) -> None:
    for arguments in ([], ["--replace"], ["--replace", "logger=csv"]):  # no corpus, or an override in its place
        result = subprocess.run(["bash", str(EXPERIMENTS / script), *arguments], cwd=tmp_path, env=_sweep_env(),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and result.stderr.startswith("usage: experiments/"), result.stderr
        assert "CORPUS: tinyshakespeare (downloaded once into experiments/data/)" in result.stderr
    assert not (EXPERIMENTS / script).parent.joinpath("logs", "logger=csv").exists() and list(tmp_path.iterdir()) == []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


@pytest.mark.slow
def test_stopping_a_sweep_stops_every_process_it_started(tmp_path: Path) -> None:
    """SIGTERM to experiments/sweep.sh (as `kill` sends it): each job stops after its step with a
    checkpoint, its worker ends instead of taking the next job, and no process of the sweep is left;
    ``--resume`` goes on with the stopped jobs and begins the one never started (three of Fig. 9's arms)."""
    (tmp_path / "experiments").mkdir()
    for name in ("sweep.sh", "corpus_path.sh"):
        shutil.copy(EXPERIMENTS / name, tmp_path / "experiments" / name)
    log = (tmp_path / "sweep.out").open("w")
    arms = 'hydra.sweeper.arms=["model=mcsd ablation=full","model=mcsd ablation=slope_only","model=transformer"]'
    sweep = subprocess.Popen(
        ["bash", "experiments/sweep.sh", "fig9_ablation", "embedded", arms, "size=tiny", "data.seq_len=32",
         "data.batch_size=2", "data.token_budget=null", "trainer.max_steps=100000", "trainer.val_check_interval=100000",
         "logger=csv", "validate_before_training=false", "callbacks.progress_bar.refresh_rate=0"],
        cwd=tmp_path, env=_sweep_env(), stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while (tmp_path / "sweep.out").read_text().count("Total FLOPs") < 2:  # both jobs' model summaries: training
        assert sweep.poll() is None and time.monotonic() < deadline, (tmp_path / "sweep.out").read_text()[-3000:]
        time.sleep(0.5)
    time.sleep(2)
    processes = _descendants(sweep.pid)
    assert len(processes) >= 3  # mcsd-train and its two job workers at least
    sweep.send_signal(signal.SIGTERM)
    assert sweep.wait(timeout=120) == 130
    assert [pid for pid in processes if _alive(pid)] == []
    output = (tmp_path / "sweep.out").read_text()
    assert output.count("mcsd-train: interrupted at step ") == 2 and "sweep.sh: stopped by SIGTERM" in output
    (folder,) = (tmp_path / "experiments" / "fig9_ablation" / "logs" / "embedded" / "train" / "multiruns").iterdir()
    assert sorted(path.name for path in folder.iterdir() if path.is_dir()) == ["0", "1"]  # no third job begun
    stopped_at = {}
    for job in ("0", "1"):
        (checkpoint,) = (folder / job / "checkpoints").glob("step-*.ckpt")
        stopped_at[job] = int(checkpoint.stem.split("-")[1])
    assert "go on with it: the same command with --resume" in output
    # --resume: the same sweep folder again, each stopped job from its checkpoint, the others begun
    resumed = subprocess.run(
        ["bash", "experiments/sweep.sh", "fig9_ablation", "--resume", "embedded", arms, "size=tiny", "data.seq_len=32",
         "data.batch_size=2", "data.token_budget=null", f"trainer.max_steps={max(stopped_at.values()) + 2}",
         "trainer.val_check_interval=100000", "test_after_training=false", "logger=csv",
         "validate_before_training=false", "callbacks.progress_bar.refresh_rate=0"],
        cwd=tmp_path, env=_sweep_env(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"sweep.sh: going on with {folder}/" in resumed.stderr
    assert [path.name for path in (tmp_path / "experiments" / "fig9_ablation" / "logs" / "embedded" / "train"
                                   / "multiruns").iterdir()] == [folder.name]  # no second sweep folder
    assert sorted(path.name for path in folder.iterdir() if path.is_dir()) == ["0", "1", "2"]
    for job, step in stopped_at.items():  # gone on from its checkpoint, logging on into the same CSV log
        assert "going on from it" in (folder / job / "train.log").read_text()
        steps = pd.read_csv(folder / job / "csv" / "version_0" / "metrics.csv")["step"].dropna()
        assert steps.min() < step < steps.max() and (folder / job / "model").is_dir()
        # its last.ckpt is the run's end, overwritten (no last-v1.ckpt beside a stale one for a later resume)
        checkpoints = folder / job / "checkpoints"
        assert sorted(path.name for path in checkpoints.iterdir()) == ["last.ckpt", f"step-{step:06d}.ckpt"]
        assert read_checkpoint(checkpoints / "last.ckpt")["global_step"] == max(stopped_at.values()) + 2
    copied = tmp_path / "experiments" / "fig9_ablation" / "trial" / "embedded"
    assert sorted(path.name for path in copied.iterdir() if path.is_dir()) == ["0", "1", "2"]


def test_a_runs_variant_is_named_from_its_fields_against_todays_defaults() -> None:
    """A run's variant is named again from its model node (a run logged before a default changed
    reads as what it was); a model the registry does not know, by what it logged or chose."""
    from mcsd.plots.runs import run_identity

    node = {"_target_": "mcsd.models.mcsd.MCSDConfig", "sections": ["slope", "decay"]}  # no gain init: legacy 1.0
    assert run_identity({"model/arch": "mcsd", "model/variant": "full", "model": node}) == (
        "mcsd", "full, decay_norm_gain_init=1.0")
    assert run_identity({"model": {"_target_": "elsewhere.Config"}, "model/arch": "toy", "model/variant": "v"}) == (
        "toy", "v")
    assert run_identity({"model": {"_target_": "elsewhere.Config"}, "choices": {"model": "toy", "variant": "v"}}) == (
        "toy", "v")


def test_an_ablation_refuses_runs_of_several_tasks(tmp_path: Path) -> None:
    """mcsd-plot ablation on a sweep of MAD's tasks averaged six tasks as six seeds: refused in one line."""
    import pandas as pd

    from mcsd.plots.runs import plot_sweep

    rows = pd.DataFrame({"run": ["0", "1"], "metric": ["val/loss"] * 2, "tokens": [1.0, 1.0], "value": [1.0, 2.0],
                         "arch": ["mcsd"] * 2, "variant": ["full"] * 2, "size": ["tiny"] * 2, "experiment": ["mad"] * 2,
                         "task": ["in_context_recall", "selective_copying"], "data": ["mad"] * 2, "seed": [0, 0]})
    with pytest.raises(MCSDError, match=r"^mcsd-plot ablation: the runs differ in their task \(in_context_recall, "
                                        r"selective_copying\), and a curve averages its runs as seeds of one task: draw "
                                        r"a sweep of tasks with mcsd-plot tasks source=DIR"):
        plot_sweep("ablation", rows, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_sweep_whose_every_job_is_refused_ends_with_the_refusal_and_draws_nothing(tmp_path: Path) -> None:
    """experiments/sweep.sh goes on to copy and draw after a sweep whose jobs did not all finish
    (exit 1 or 2); one that ran no job ends with its status, no results folder and no second error."""
    (tmp_path / "experiments").mkdir()
    for name in ("sweep.sh", "corpus_path.sh"):
        shutil.copy(EXPERIMENTS / name, tmp_path / "experiments" / name)
    result = subprocess.run(
        ["bash", "experiments/sweep.sh", "fig9_ablation", "embedded", "size=tiny", "optimizer.lr=-1", "logger=csv"],
        cwd=tmp_path, env=_sweep_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "optimizer.lr=-1 must be 0 or more" in result.stderr and "mcsd-plot: error" not in result.stderr
    assert not (tmp_path / "experiments" / "fig9_ablation" / "trial").exists()
