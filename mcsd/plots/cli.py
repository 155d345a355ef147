"""mcsd-plot: figures from result files.

    mcsd-plot inference logs/bench/runs/<time>/results.csv   # Figs. 5-8
    mcsd-plot train logs/bench/runs/<time>/results.csv       # training cost
"""

from __future__ import annotations

import argparse

from mcsd.cli import run_or_exit
from mcsd.plots.cost import plot_inference, plot_train

COMMANDS = {"inference": plot_inference, "train": plot_train}


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``mcsd-plot``."""
    parser = argparse.ArgumentParser(prog="mcsd-plot", description="Draw the paper's figures from result files.")
    parser.add_argument("kind", choices=sorted(COMMANDS), help="which figures")
    parser.add_argument("results", help="a results.csv or results.json written by mcsd-bench")
    parser.add_argument("--out", default=None, help="folder for the figures (default: beside the results)")
    args = parser.parse_args(argv)
    paths = run_or_exit("mcsd-plot", lambda: COMMANDS[args.kind](args.results, args.out))
    print("\n".join(str(path) for path in paths))


if __name__ == "__main__":
    main()
