"""mcsd-bench: inference and training cost of registered architectures (or saved models), side by side.

    mcsd-bench                       # bench=cpu_quick, mode=inference
    mcsd-bench mode=train
    mcsd-bench bench=paper           # Section 3.3's grid (1.6B, bf16, a GPU)
    mcsd-bench models=[mcsd,logs/train/runs/<run>/checkpoints/step-000100.ckpt]
    mcsd-bench models=[logs/train/runs/<run>/csv/version_0/hparams.yaml]   # the run's model, random weights
Every point runs after a warm-up; on a CPU each point runs in a fresh child process so
that peak resident memory belongs to that point alone. A point that fails is a row of its own
(``status`` oom or error, with its one-line ``reason``) and the grid goes on. Results:
results.csv and results.json (with a header naming the machine), written after every point, in
the run directory.
"""

from __future__ import annotations

from omegaconf import DictConfig

from mcsd.bench.grid import bench
from mcsd.commands.app import hydra_app


@hydra_app("mcsd-bench", "bench")
def main(cfg: DictConfig) -> None:
    """Entry point of ``mcsd-bench``."""
    bench(cfg)


if __name__ == "__main__":
    main()
