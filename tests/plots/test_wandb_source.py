"""``mcsd-plot ... wandb=FOLDER``: the figures and tables of a sweep from its offline W&B runs (read
through W&B's record schema), equal to the CSV route's; a source that mixes sweeps in one curve,
a folder with no W&B runs and a source that is neither are refused in one line."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from helpers.runs import TINY_SWEEP, run_here
from mcsd.errors import MCSDError
from mcsd.plots.runs import check_one_source, load_csv_runs, load_offline_wandb_runs

WANDB_SWEEP = [*[override for override in TINY_SWEEP if not override.startswith("logger=")], "logger=wandb",
               "size=tiny", "data=embedded"]


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two ``-m`` sweeps of two seeds each, logged offline to W&B and to CSV, in one log folder."""
    cwd = tmp_path_factory.mktemp("wandb_sweeps")
    for learning_rate in ("8e-4", "1e-3"):
        result = run_here("mcsd-train", "-m", *WANDB_SWEEP, "seed=0,1", f"optimizer.lr={learning_rate}", cwd=cwd)
        assert result.returncode == 0, result.stderr[-3000:]
    return sorted((cwd / "logs" / "train" / "multiruns").iterdir())


def test_offline_wandb_runs_give_the_csv_routes_rows_and_table(two_sweeps: list[Path], tmp_path: Path) -> None:
    sweep = two_sweeps[0]
    key = ["metric", "arch", "variant", "size", "seed", "tokens"]
    from_wandb = load_offline_wandb_runs(sweep).sort_values(key)[key + ["value"]].reset_index(drop=True)
    from_csv = load_csv_runs(sweep).sort_values(key)[key + ["value"]].reset_index(drop=True)
    assert len(from_csv) > 0 and from_wandb.equals(from_csv)
    tables = [run_here("mcsd-plot", "ablation", source, f"out={tmp_path / name}", cwd=tmp_path)
              for name, source in (("csv", f"source={sweep}"), ("wandb", f"wandb={sweep}"))]
    assert [table.returncode for table in tables] == [0, 0], tables[1].stderr[-2000:]
    assert tables[0].stdout.replace(str(tmp_path / "csv"), "OUT") == tables[1].stdout.replace(str(tmp_path / "wandb"), "OUT")
    assert "| MCSD" in tables[0].stdout
    assert (tmp_path / "wandb" / "fig9_ablation.png").is_file()


def test_a_source_that_mixes_sweeps_in_a_curve_is_refused_in_one_line(two_sweeps: list[Path], tmp_path: Path) -> None:
    both = two_sweeps[0].parent
    result = run_here("mcsd-plot", "ablation", f"wandb={both}", f"out={tmp_path}", cwd=tmp_path)
    names = ", ".join(sweep.name for sweep in two_sweeps)
    assert result.returncode == 2
    assert f"the runs of curve mcsd|full come from 2 sweeps ({names})" in result.stderr
    assert "Traceback" not in result.stderr and not list(tmp_path.iterdir())


@pytest.mark.parametrize(("source", "message"), [
    ("folder", "holds no W&B runs (wandb/offline-run-*/run-*.wandb)"),
    ("'not a project'", "wandb=not a project is neither a folder (of offline W&B runs) nor ENTITY/PROJECT"),
    ("me/mcsd", "wandb=ENTITY/PROJECT needs group="),
])
def test_a_wandb_source_that_cannot_be_read_is_refused_in_one_line(tmp_path: Path, source: str, message: str) -> None:
    if source == "folder":
        (tmp_path / "folder").mkdir()
    result = run_here("mcsd-plot", "ablation", f"wandb={source}", cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_wandb_is_refused_for_a_figure_it_does_not_draw(tmp_path: Path) -> None:
    result = run_here("mcsd-plot", "mqar", "wandb=me/mcsd", "group=g", cwd=tmp_path)
    assert result.returncode == 2 and "wandb draws training sweeps (mcsd-plot scaling, ablation): mcsd-plot mqar " \
        "reads its folder (mcsd-plot mqar source=DIR)" in result.stderr


@pytest.mark.parametrize(("column", "values", "what"), [("data", ["embedded", "text_files: a.txt"], "corpora"),
                                                         ("size", ["small", "tiny"], "sizes")])
def test_a_curve_of_two_corpora_or_sizes_is_refused(column: str, values: list[str], what: str) -> None:
    rows = pd.DataFrame({"arch": "mcsd", "variant": "full", "size": "tiny", "data": "embedded", "sweep": "s",
                         "run": ["a", "b"], "metric": "val/loss", "tokens": 1.0, "value": 1.0})
    rows[column] = values
    with pytest.raises(MCSDError, match=rf"the runs of curve mcsd\|full come from 2 {what} \({', '.join(values)}\)"):
        check_one_source("ablation", rows)
    check_one_source("ablation", rows.assign(**{column: values[0]}))  # one of each: drawn
