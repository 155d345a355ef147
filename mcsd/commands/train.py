r"""mcsd-train: train a language model, log it, leave a checkpoint and a saved model.

    mcsd-train                                  # embedded corpus, MCSD size=small, CPU
    mcsd-train model=transformer size=tiny trainer.max_steps=50
    mcsd-train -m model=mcsd,transformer seed=0,1
    mcsd-train model=rwkv4 model.perspectives=2 init_from=RUN_DIR "trainable=['.*mix_.*','streams\..*']"
Returns the final validation loss, the metric that sweeps optimise.
"""

from __future__ import annotations

from omegaconf import DictConfig

from mcsd.commands.app import hydra_app


@hydra_app("mcsd-train", "train")
def main(cfg: DictConfig) -> float:
    """Entry point of ``mcsd-train``: one line and exit status 2 for a setting that cannot work."""
    from mcsd.training.run import run  # Lightning and what trains load here, in the process that trains

    return run(cfg)


if __name__ == "__main__":
    main()
