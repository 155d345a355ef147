"""experiment=compare_architectures trains every variant of every registered architecture on
the same data, tokens and seed, and ``mcsd-plot compare`` tabulates them, one row each."""

from __future__ import annotations

import math
import shutil
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from helpers.runs import run_here
from mcsd.models import registry
from mcsd.models.registry import class_path, field_defaults
from mcsd.models.config import ConfigError
from mcsd.plots.compare import (_cell, best_rate_jobs, best_rate_perplexities, comparison_table, final_perplexities,
                                markdown_comparison, plot_comparison)
from mcsd.plots.experiments import draw
from mcsd.plots.runs import curve_key, curve_label, load_csv_runs
from helpers.runs import TINY_SWEEP, sweep_dir


@pytest.mark.slow
def test_the_comparison_trains_every_registered_variant_and_tabulates_it(tmp_path: Path) -> None:
    result = run_here("mcsd-train", "-m", "experiment=compare_architectures", "size=tiny", "hydra.sweeper.params.seed=0",
                     "optimizer.lr=8e-4", *TINY_SWEEP, cwd=tmp_path)  # one rate of the grid's four: on the command line
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = sweep_dir(tmp_path)
    expected = [(name, variant) for name in registry.architectures() for variant in registry.get(name).variants]
    configs = [yaml.safe_load((job / "csv" / "version_0" / "hparams.yaml").read_text())
               for job in sorted((path for path in sweep.iterdir() if path.is_dir()), key=lambda path: int(path.name))]
    assert len(configs) == len(expected)
    assert {(config["data"]["token_budget"], config["seed"], config["choices"]["size"], config["optimizer"]["lr"])
            for config in configs} == {(384, 0, "tiny", 8e-4)}  # the same data budget, seed, size and rate for every arm

    plotted = run_here("mcsd-plot", "compare", f"source={sweep}", cwd=tmp_path)
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    table = comparison_table(sweep).table
    assert list(table["label"]) == [curve_label("ablation", curve_key(name, variant), None) for name, variant in expected]
    rows = load_csv_runs(sweep)
    final = rows[rows["metric"] == "val/ppl"].sort_values("tokens").groupby(["arch", "variant"])["value"].last()
    assert table.set_index(["arch", "variant"])["val_ppl"].to_dict() == final.to_dict()
    assert (sweep / "architectures_compared_table.md").read_text().count("\n| ") == 1 + len(expected)


def _mqar_runs(points: list[tuple[str, int, int, int, float, float]]) -> pd.DataFrame:
    """Runs as ``load_mqar_runs`` reads them: (arch, T, K, width, lr, final accuracy) each."""
    return pd.DataFrame([{"run": f"run{index}", "curve": curve_key(arch, next(iter(registry.get(arch).variants))),
                          "width": width, "seq_len": seq_len, "num_pairs": num_pairs, "lr": lr, "seed": 0, "params": 1,
                          "accuracy": accuracy, "state_bytes": width * 4}
                         for index, (arch, seq_len, num_pairs, width, lr, accuracy) in enumerate(points)])


def _write_probe(folder: Path, arch: str, deltas: dict[int, float]) -> None:
    """One ``mcsd-probe context`` result: Delta_N per window (intervals +-0.01, swapped 0)."""
    variant = next(iter(registry.get(arch).variants))
    folder.mkdir(parents=True)
    pd.DataFrame([{"window": window, "delta": delta, "delta_low": delta - 0.01, "delta_high": delta + 0.01,
                   "swapped": 0.0, "swapped_low": -0.01, "swapped_high": 0.01, "documents": 3, "positions": 4,
                   "arch": arch, "variant": variant, "label": curve_label("ablation", curve_key(arch, variant), None)}
                  for window, delta in deltas.items()]).to_csv(folder / "context_delta.csv", index=False)
    pd.DataFrame({"bin_start": [0], "bin_end": [63], "loss": [5.0], "loss_low": [4.9], "loss_high": [5.1],
                  "arch": [arch]}).to_csv(folder / "context_curve.csv", index=False)


def test_comparison_columns_are_read_where_the_architectures_separate(tmp_path: Path, monkeypatch) -> None:
    # MQAR: the Transformer solves (64, 4) at both widths and (128, 8) only at width 64, (256, 16)
    # nowhere, so the column is read at (128, 8), width 64, each row at its best learning rate.
    runs = _mqar_runs([("transformer", 64, 4, 64, 1e-3, 0.995), ("transformer", 64, 4, 128, 1e-3, 0.996),
                       ("transformer", 128, 8, 64, 1e-3, 0.993), ("transformer", 128, 8, 64, 3e-3, 0.1),
                       ("transformer", 128, 8, 128, 1e-3, 0.5), ("transformer", 256, 16, 128, 1e-3, 0.3),
                       ("mcsd", 128, 8, 64, 1e-3, 0.1), ("mcsd", 128, 8, 64, 3e-3, 0.2),
                       ("mcsd", 128, 8, 128, 1e-3, 0.4), ("mcsd", 256, 16, 128, 1e-3, 0.05)])
    monkeypatch.setattr("mcsd.plots.compare.load_mqar_runs", lambda root: runs)
    root = tmp_path / "compare"
    (tmp_path / "mqar").mkdir()  # the sweep's folder (its runs as above)
    # Delta_N: the rows differ most at N=8 (MCSD's mean over 2 seeds +0.02, the Transformer's -0.3).
    _write_probe(root / "probe" / "0", "mcsd", {8: 0.01, 32: 0.02, 128: 0.0})
    _write_probe(root / "probe" / "1", "mcsd", {8: 0.03, 32: 0.0, 128: 0.0})
    _write_probe(root / "probe" / "2", "transformer", {8: -0.3, 32: 0.01, 128: 0.001})
    # Decode: batch 1 and batch 16 at the longest length (a shorter one is ignored).
    (root / "bench_inference").mkdir()
    pd.DataFrame([{"arch": arch, "variant": next(iter(registry.get(arch).variants)), "batch": batch, "prompt_len": 8,
                   "gen_len": gen_len, "decode_s_per_token": seconds, "state_bytes_per_sequence": 64, "status": "ok",
                   "device": "cpu"}
                  for arch, batch, gen_len, seconds in [("mcsd", 1, 64, 0.001), ("mcsd", 1, 256, 0.004),
                                                        ("mcsd", 16, 256, 0.008), ("transformer", 1, 256, 0.005),
                                                        ("transformer", 16, 256, 0.02)]
                  ]).to_csv(root / "bench_inference" / "results.csv", index=False)

    comparison = comparison_table(root, tmp_path / "mqar")
    table = comparison.table.set_index("arch")
    assert table.loc["transformer", "mqar_acc"] == 0.993 and table.loc["mcsd", "mqar_acc"] == 0.2
    assert comparison.notes["mqar"].startswith("T=128, K=8, width 64: the hardest setting where Transformer reaches 0.99")
    assert table.loc["mcsd", "delta"] == pytest.approx(0.02) and table.loc["transformer", "delta"] == -0.3
    assert comparison.notes["context_window"] == "8"
    assert len(comparison.context_curves) == 6  # 2 rows x 3 windows, the seeds averaged
    assert table.loc["mcsd", "decode_tokens_per_s"] == pytest.approx(250)
    assert table.loc["mcsd", "decode_batched_tokens_per_s"] == pytest.approx(2000)
    assert table.loc["transformer", "decode_batched_tokens_per_s"] == pytest.approx(800)
    markdown = markdown_comparison(comparison)
    assert "| Delta_N at N=8 [interval] / swapped |" in markdown and "| decode tokens/s, batch 16 |" in markdown
    assert "| MCSD full |  |  |  | 0.200 | +0.020 [+0.000, +0.040] / +0.000 |  | 250 | 2,000 | 0.1 |" in markdown
    assert [path.name for path in plot_comparison(comparison, tmp_path / "plots")] == [
        "architectures_compared.png", "architectures_compared.pdf", "architectures_compared_table.md"]

    # An anchor that solves no setting: each row at its own hardest point, and the note says so.
    fallback = comparison_table(root, tmp_path / "mqar", mqar_anchor="retnet")
    assert fallback.table.set_index("arch").loc[["transformer", "mcsd"], "mqar_acc"].tolist() == [0.3, 0.05]
    assert fallback.notes["mqar"].endswith("(each row's hardest setting run: RetNet reaches 0.99 at none)")
    with pytest.raises(ConfigError, match="architecture 'attention' is not registered"):
        comparison_table(root, tmp_path / "mqar", mqar_anchor="attention")

    # Batch 1 alone: no batched column.
    frame = pd.read_csv(root / "bench_inference" / "results.csv")
    frame[frame["batch"] == 1].to_csv(root / "bench_inference" / "results.csv", index=False)
    assert "batch 16" not in markdown_comparison(comparison_table(root))


def _write_run(job: Path, arch: str, lr: float, seed: int, perplexities: list[float]) -> None:
    """One training run's CSV log as ``sweep.sh`` copies it (``<job>/csv/version_0``): the
    architecture's default model node, the rate and seed, validation perplexity every 100 tokens."""
    config_class = registry.get(arch).config_class
    model = {"_target_": class_path(config_class), **field_defaults(config_class)}
    logs = job / "csv" / "version_0"
    logs.mkdir(parents=True)
    (logs / "hparams.yaml").write_text(yaml.safe_dump({"model": model, "optimizer": {"lr": lr}, "seed": seed,
                                                       "model/params": 1000}))
    pd.DataFrame({"step": range(len(perplexities)), "trainer/tokens": [100.0 * (i + 1) for i in range(len(perplexities))],
                  "train/loss": [math.log(ppl) for ppl in perplexities], "val/loss": [math.log(ppl) for ppl in perplexities],
                  "val/ppl": perplexities}).to_csv(logs / "metrics.csv", index=False)


def test_each_row_is_read_at_its_best_learning_rate(tmp_path: Path) -> None:
    # MCSD at 3 rates (2 seeds at 1e-3, the best by its mean), the Transformer at 3 (its best the
    # highest rate tried; the lowest diverged). Each job's probe has its own Delta_N: the table
    # reads the best rate's jobs alone.
    root = tmp_path / "compare"
    runs = [("mcsd", 3e-4, 0, [90.0, 60.0]), ("mcsd", 1e-3, 0, [80.0, 40.0]), ("mcsd", 1e-3, 1, [80.0, 44.0]),
            ("mcsd", 3e-3, 0, [70.0, 43.0]), ("transformer", 3e-4, 0, [90.0, math.inf]),
            ("transformer", 1e-3, 0, [90.0, 50.0]), ("transformer", 3e-3, 0, [90.0, 45.0])]
    for job, (arch, lr, seed, perplexities) in enumerate(runs):
        _write_run(root / str(job), arch, lr, seed, perplexities)
        _write_probe(root / "probe" / str(job), arch, {8: 0.1 * job, 64: 0.0})

    comparison = comparison_table(root, tmp_path / "no_mqar")
    table = comparison.table.set_index("arch")
    assert table.loc["mcsd", ["lr", "val_ppl", "val_ppl_min", "val_ppl_max", "seeds", "lrs_tried", "at_edge"]].tolist() == [
        1e-3, 42.0, 40.0, 44.0, 2, 3, False]
    assert table.loc["transformer", ["lr", "val_ppl", "seeds", "lrs_tried", "at_edge"]].tolist() == [3e-3, 45.0, 1, 3, True]
    assert table.loc["mcsd", "delta"] == pytest.approx(0.15)  # jobs 1 and 2, not 0 or 3
    assert table.loc["transformer", "delta"] == pytest.approx(0.6)  # job 6
    assert best_rate_jobs(root) == ["1", "2", "6"]
    rates = comparison.rate_curves.set_index(["arch", "lr"])
    assert rates.loc[("mcsd", 3e-4), "val_ppl"] == 60.0 and pd.isna(rates.loc[("transformer", 3e-4), "val_ppl"])

    markdown = markdown_comparison(comparison)
    assert "| lr (rates tried) |" in markdown
    assert "| MCSD full | 1,000 | 42.00 (40.00-44.00) | 2 | 0.001 (3) |" in markdown
    assert "| Transformer | 1,000 | 45.00 (45.00-45.00) | 1 | 0.003* (3) |" in markdown
    assert "the grid does not bracket it" in markdown and "lowest mean validation perplexity" in markdown
    assert "compared on the seeds every rate ran" in markdown
    assert [path.name for path in plot_comparison(comparison, tmp_path / "plots")] == [
        "architectures_compared.png", "architectures_compared.pdf", "architectures_compared_rates.png",
        "architectures_compared_rates.pdf", "architectures_compared_table.md"]

    # Drawn as run.sh draws it: the training curves are the best rates' runs alone (MCSD's 2 seeds).
    drawn = draw(root, "compare_architectures")
    assert "architectures_compared_rates.png" in {path.name for path in drawn.paths}
    assert "| MCSD full | 2 | 200 | 3.737 (3.689-3.784) | 42.0 |" in drawn.markdown
    assert "| Transformer | 1 | 200 | 3.807 | 45.0 |" in drawn.markdown

    # One rate for every row (the committed comparison): no rate column, no rates figure.
    for job in (0, 3, 4, 5):
        for folder in (root / str(job), root / "probe" / str(job)):
            for path in sorted(folder.rglob("*"), reverse=True):
                path.unlink() if path.is_file() else path.rmdir()
            folder.rmdir()
    single = comparison_table(root, tmp_path / "no_mqar")
    assert single.rate_curves is None and "lr (rates tried)" not in markdown_comparison(single)
    assert single.table.set_index("arch").loc["transformer", "delta"] == pytest.approx(0.6)
    # Redrawn into the folder that held the rates figure: the stale figure goes.
    assert [path.name for path in plot_comparison(single, tmp_path / "plots")] == [
        "architectures_compared.png", "architectures_compared.pdf", "architectures_compared_table.md"]
    assert sorted(path.name for path in (tmp_path / "plots").iterdir()) == [
        "architectures_compared.pdf", "architectures_compared.png", "architectures_compared_table.md"]


def test_a_run_that_stopped_early_has_no_final_perplexity(tmp_path: Path) -> None:
    # A diverged run's log ends at its last validation before the loss went NaN (here 20.0 after 100
    # tokens, where the others ran to 200): it loses to every rate that trained, as a diverged one.
    for job, (lr, perplexities) in enumerate([(1e-3, [90.0, 40.0]), (1e-2, [20.0]), (3e-3, [80.0, 45.0])]):
        _write_run(tmp_path / str(job), "mcsd", lr, 0, perplexities)
    final = final_perplexities(tmp_path).set_index("job")
    assert final.loc[["0", "2"], "value"].tolist() == [40.0, 45.0] and pd.isna(final.loc["1", "value"])
    best = best_rate_perplexities(final_perplexities(tmp_path))
    assert best[["lr", "val_ppl", "lrs_tried", "at_edge"]].values.tolist() == [[1e-3, 40.0, 3, True]]


def test_the_edge_star_reads_any_boolean() -> None:
    # The merged table's at_edge may hold Python or numpy booleans, or nothing (a row without training runs).
    row = {"lr": 0.01, "lrs_tried": 4}
    text = "{lr:g}{edge} ({lrs_tried:.0f})"
    assert [_cell({**row, "at_edge": flag}, "lr", text) for flag in (True, np.bool_(True), False, np.bool_(False),
                                                                      float("nan"), None)] == [
        "0.01* (4)", "0.01* (4)", "0.01 (4)", "0.01 (4)", "0.01 (4)", "0.01 (4)"]


def test_result_jobs_pick_the_jobs_to_benchmark_and_to_probe(tmp_path: Path) -> None:
    """experiments/result_jobs.sh: the benchmarks build each model with random weights, so a rate
    sweep's jobs of one model are benchmarked once (the first seed's first job); the probes read each
    model's best rate's jobs."""
    for job, (arch, lr, seed, ppl) in enumerate([("mcsd", 1e-3, 0, 30.0), ("mcsd", 1e-3, 1, 34.0), ("mcsd", 3e-3, 0, 31.0),
                                                  ("transformer", 1e-3, 0, 40.0), ("retnet", 1e-3, 0, 50.0),
                                                  ("transformer", 3e-3, 0, 39.0)]):
        _write_run(tmp_path / str(job), arch, lr, seed, [ppl])
    script = Path(__file__).parents[2] / "experiments" / "result_jobs.sh"

    # As run.sh calls them: with the project's Python first on PATH (an activated install).
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def listed(function: str) -> list[str]:
        return subprocess.run(["bash", "-c", f'source "{script}"; {function} "{tmp_path}"'], capture_output=True,
                              text=True, check=True, env=env).stdout.split()

    assert sorted(listed("bench_jobs"), key=int) == ["0", "3", "4"]
    # MCSD: on seed 0, the seed both rates ran, 30 at 1e-3 against 31 at 3e-3 (seed 1's 34 does not decide),
    # so both of 1e-3's jobs
    assert listed("best_rate_jobs") == ["0", "1", "4", "5"]


def test_run_sh_probes_the_best_jobs_without_a_probe_and_none_twice(tmp_path: Path) -> None:
    """experiments/compare_architectures/run.sh after its sweep (a stub here: the jobs are written
    beforehand, the last one diverged): it probes each best-rate job that has no probe yet, in its
    own folder, and where every one has its probe it probes nothing and ends as the sweep did (the
    probe command once without a job: status 123 after a sweep whose one job diverged)."""
    experiments = tmp_path / "experiments"
    (experiments / "compare_architectures").mkdir(parents=True)
    source = Path(__file__).parents[2] / "experiments"
    for name in ("compare_architectures/run.sh", "corpus_arguments.sh", "corpus_path.sh", "split_corpus.sh",
                 "result_jobs.sh"):
        shutil.copy(source / name, experiments / name)
    (experiments / "sweep.sh").write_text("#!/usr/bin/env bash\nexit 0\n")
    (experiments / "sweep.sh").chmod(0o755)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    calls = tmp_path / "calls.txt"
    for command in ("mcsd-probe", "mcsd-plot"):
        (stubs / command).write_text(f'#!/usr/bin/env bash\necho "{command} $*" >> "{calls}"\n')
        (stubs / command).chmod(0o755)
    results = experiments / "compare_architectures" / "corpus"
    for job, (arch, lr, ppl) in enumerate([("mcsd", 1e-3, 30.0), ("mcsd", 3e-3, 29.0), ("mcsd", 1e-2, math.inf)]):
        _write_run(results / str(job), arch, lr, 0, [ppl])
        hparams = results / str(job) / "csv" / "version_0" / "hparams.yaml"
        hparams.write_text(hparams.read_text() + f"callbacks:\n  model_checkpoint:\n    dirpath: /runs/{job}/model\n")
    (tmp_path / "corpus.txt").write_text("".join(f"line {i}\n" for i in range(20)))
    env = {**os.environ, "PATH": f"{stubs}:{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def run() -> list[str]:
        calls.unlink(missing_ok=True)
        result = subprocess.run(["bash", str(experiments / "compare_architectures" / "run.sh"), "--no-bench", "--add",
                                 str(tmp_path / "corpus.txt")], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        return calls.read_text().splitlines()

    probed, plotted = run()
    assert probed.startswith("mcsd-probe context ckpt=/runs/1/model ") and f"output_dir={results}/probe/1 " in probed
    assert plotted == f"mcsd-plot experiment source={results} name=compare_architectures"
    (results / "probe" / "1").mkdir(parents=True)
    assert run() == [plotted]
