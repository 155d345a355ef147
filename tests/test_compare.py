"""experiment=compare_architectures trains every variant of every registered architecture on
the same data, tokens and seed, and ``mcsd-plot compare`` tabulates them, one row each."""

from __future__ import annotations

from pathlib import Path

import yaml

from harness import run_cli
from mcsd.models import registry
from mcsd.plots.compare import comparison_table
from mcsd.plots.runs import curve_label, load_csv_runs
from test_experiments import TINY_SWEEP, sweep_dir


def test_the_comparison_trains_every_registered_variant_and_tabulates_it(tmp_path: Path) -> None:
    result = run_cli("mcsd-train", "-m", "experiment=compare_architectures", "size=tiny", "hydra.sweeper.params.seed=0",
                     *TINY_SWEEP, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = sweep_dir(tmp_path)
    expected = [(name, variant) for name in registry.architectures() for variant in registry.get(name).variants]
    configs = [yaml.safe_load((job / "csv" / "version_0" / "hparams.yaml").read_text())
               for job in sorted((path for path in sweep.iterdir() if path.is_dir()), key=lambda path: int(path.name))]
    assert len(configs) == len(expected)
    assert {(config["data"]["token_budget"], config["seed"], config["choices"]["size"]) for config in configs} == {
        (384, 0, "tiny")}  # the same data budget, seed and size for every arm

    plotted = run_cli("mcsd-plot", "compare", str(sweep), cwd=tmp_path)
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    table = comparison_table(sweep).table
    assert list(table["label"]) == [curve_label("ablation", f"{name}|{variant}", None) for name, variant in expected]
    rows = load_csv_runs(sweep)
    final = rows[rows["metric"] == "val/ppl"].sort_values("tokens").groupby(["arch", "variant"])["value"].last()
    assert table.set_index(["arch", "variant"])["val_ppl"].to_dict() == final.to_dict()
    assert (sweep / "architectures_compared_table.md").read_text().count("\n| ") == 1 + len(expected)
