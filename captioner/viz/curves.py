"""Training curves from a run's files alone (metrics.csv, step_losses.csv), without torch."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backend_bases import FigureCanvasBase  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from captioner.core.errors import CaptionerError  # noqa: E402
from captioner.core.files import check_writable_file, write_atomically  # noqa: E402
from captioner.training.history import (  # noqa: E402
    CURVES, METRICS, STEP_LOSSES, epochs_trained, read_history, read_step_losses)


def training_figure(history: list[dict], step_losses: list[tuple[int, float]], metric: str,
                    beam_size: int = 1) -> Figure:
    """Training loss per epoch (and per logged step) beside the validation scores."""
    fig, (ax_loss, ax_val) = plt.subplots(1, 2, figsize=(11, 4))
    if step_losses:
        ax_loss.plot([s for s, _ in step_losses], [v for _, v in step_losses], alpha=0.5, label="per logged step")
    trained = [r for r in history if "train_loss" in r]  # an SCST stage's epoch 0 is validation only
    ax_loss.plot([r["step"] for r in trained], [r["train_loss"] for r in trained], "o-", label="epoch mean")
    ax_loss.set(xlabel="step", ylabel="training loss", title="training loss")
    ax_loss.legend()
    for key in ("val_Bleu_1", "val_Bleu_4", "val_CIDEr"):
        if key in history[0]:
            ax_val.plot([epochs_trained(r) for r in history], [r[key] for r in history], "o-", label=key[4:])
    decoding = "greedy decoding" if beam_size == 1 else f"beam {beam_size}"
    ax_val.set(xlabel="epoch", ylabel="score", title=f"validation ({decoding}); best by {metric}")
    ax_val.legend()
    fig.tight_layout()
    return fig


def plot_run(run_dir: str | Path, metric: str, beam_size: int = 1) -> Path | None:
    """Draw `run_dir`'s curves into its training_curves.png; None when it has no history yet."""
    run_dir = Path(run_dir)
    history = read_history(run_dir / METRICS)
    if not history:
        return None
    fig = training_figure(history, read_step_losses(run_dir / STEP_LOSSES), metric, beam_size)
    return save_figure(fig, run_dir / CURVES)[0]


def runs_figure(runs: list[tuple[str, list[dict]]], val: str = "CIDEr", train: str = "reward",
                title: str = "") -> Figure:
    """Runs side by side, (label, history) each: left `val_<val>` by epochs trained, right `train_<train>`."""
    fig, (ax_val, ax_train) = plt.subplots(1, 2, figsize=(11, 4))
    for label, history in runs:
        scores = [(epochs_trained(r), r[f"val_{val}"]) for r in history if f"val_{val}" in r]
        trained = [(r["epoch"], r[f"train_{train}"]) for r in history if f"train_{train}" in r]
        line = ax_val.plot(*zip(*scores), "o-", label=label)[0]
        if trained:
            ax_train.plot(*zip(*trained), "o-", color=line.get_color(), label=label)
    ax_val.set(xlabel="epoch", ylabel=f"val {val}", title=title or f"validation {val}")
    ax_train.set(xlabel="epoch", ylabel=f"train {train}", title=f"training {train} (epoch mean)")
    ax_val.legend(fontsize=8)
    ax_train.legend(fontsize=8)
    fig.tight_layout()
    return fig


def check_figure_path(path: str | Path) -> None:
    """Refuse, in one line and before anything is drawn, a figure file `save_figure` could not write: a format
    matplotlib has no writer for (the suffix), a folder standing there, a folder above it that cannot be made."""
    path = Path(path)
    kind = path.suffix.lstrip(".").lower() or "png"
    if kind not in FigureCanvasBase.get_supported_filetypes():
        raise CaptionerError(f"{path}: matplotlib writes no .{kind} figures; name a .png, .pdf or .svg file")
    check_writable_file(path)


def save_figure(fig: Figure, *paths: str | Path, dpi: int = 100) -> list[Path]:
    """Write `fig` atomically to each path (format from the suffix), then close it."""
    written = [Path(path) for path in paths]
    try:
        for path in written:
            write_atomically(
                path, lambda tmp: fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".") or "png"))  # noqa: B023
    finally:
        plt.close(fig)
    return written
