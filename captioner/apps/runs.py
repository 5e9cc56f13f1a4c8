"""A training run as the apps start one: `fit`, then the run's curves (rank 0 alone under torchrun)."""

from __future__ import annotations

from pathlib import Path

from captioner.core.config_sections import Config


def train_run(config: Config, resume: bool = False) -> Path:
    """Train as `config` says; returns the best checkpoint, with training_curves.png beside it."""
    from captioner.training.distributed import is_main_process
    from captioner.training.fit import fit  # the training stack, only when there is a model to train
    from captioner.viz.curves import plot_run

    best = fit(config, resume=resume)
    if is_main_process():  # under torchrun, rank 0 alone writes the run's files
        plot_run(config.train.out_dir, config.train.val_metric, config.train.val_beam_size)
    return best
