"""Training curves from a run's files: scripts/plot_runs.py (several runs) and the curves
`captioner train` draws (viz.curves), checked through what the figures plot, not just that a
PNG appeared; and neither imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from captioner.training.history import read_history, write_step_losses
from captioner.viz.curves import plot_run, runs_figure, training_figure

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, str(ROOT / "scripts" / "plot_runs.py")]


def write_run(folder: Path, rewards: list[float]) -> None:
    folder.mkdir()
    rows = ["epoch,step,val_CIDEr,seconds,train_loss,train_reward", "0,0,0.30,1.0,,"]
    rows += [f"{e},{10 * e},{0.30 + 0.01 * e},5.0,-0.5,{r}" for e, r in enumerate(rewards, start=1)]
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")


def lines(ax) -> list[tuple[str, list[float], list[float]]]:
    """(label, x, y) of every line drawn on `ax`, y rounded to the CSV's digits."""
    return [(line.get_label(), [float(x) for x in line.get_xdata()], [round(float(y), 6) for y in line.get_ydata()])
            for line in ax.get_lines()]


def test_runs_figure_draws_each_runs_columns(tmp_path: Path) -> None:
    write_run(tmp_path / "a", [0.3, 0.4])
    write_run(tmp_path / "b", [0.7, 0.8, 0.9])
    runs = [("t1", read_history(tmp_path / "a" / "metrics.csv")),
            ("t0.5", read_history(tmp_path / "b" / "metrics.csv"))]
    fig = runs_figure(runs, val="CIDEr", train="reward")
    ax_val, ax_train = fig.axes
    assert lines(ax_val) == [("t1", [0, 1, 2], [0.30, 0.31, 0.32]), ("t0.5", [0, 1, 2, 3], [0.30, 0.31, 0.32, 0.33])]
    # epoch 0 trained nothing
    assert lines(ax_train) == [("t1", [1, 2], [0.3, 0.4]), ("t0.5", [1, 2, 3], [0.7, 0.8, 0.9])]
    assert [line.get_color() for line in ax_val.get_lines()] == [line.get_color() for line in ax_train.get_lines()]
    assert ax_val.get_ylabel() == "val CIDEr" and ax_train.get_ylabel() == "train reward"


def test_the_script_writes_the_figure_without_torch_and_names_a_missing_run(tmp_path: Path) -> None:
    write_run(tmp_path / "a", [0.3, 0.4])
    out = tmp_path / "fig" / "curves.png"
    probe = (
        "import runpy, sys, json; sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__'); print(json.dumps('torch' in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe, SCRIPT[1], str(out), f"{tmp_path / 'a'}:t1"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) is False  # a CSV plotted with no torch in the process
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    missing = subprocess.run([*SCRIPT, str(out), f"{tmp_path / 'nowhere'}:x"], capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        f"error: {tmp_path / 'nowhere' / 'metrics.csv'}: no metrics.csv (is {tmp_path / 'nowhere'} a train.out_dir?)")


def test_training_curves_come_from_the_run_files(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    assert plot_run(run, "Bleu_4") is None  # no history yet: nothing drawn
    (run / "metrics.csv").write_text(
        "epoch,step,train_loss,val_Bleu_1,val_Bleu_4,val_CIDEr,seconds\n1,5,2.5,0.5,0.1,0.2,1\n2,10,2.0,0.6,0.2,0.4,1\n"
    )
    write_step_losses(run / "step_losses.csv", [[2, 3.0], [4, 2.6], [6, 2.2]])
    assert plot_run(run, "Bleu_4",
                    beam_size=3) == run / "training_curves.png" and (run / "training_curves.png").is_file()
    fig = training_figure(read_history(run / "metrics.csv"), [(2, 3.0), (4, 2.6), (6, 2.2)], "Bleu_4", 3)
    ax_loss, ax_val = fig.axes
    assert lines(ax_loss) == [("per logged step", [2, 4, 6], [3.0, 2.6, 2.2]), ("epoch mean", [5, 10], [2.5, 2.0])]
    assert lines(ax_val) == [("Bleu_1", [1, 2], [0.5, 0.6]), ("Bleu_4", [1, 2], [0.1, 0.2]),
                             ("CIDEr", [1, 2], [0.2, 0.4])]
    assert ax_val.get_title() == "validation (beam 3); best by Bleu_4"


def test_the_script_names_a_damaged_metrics_file_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A metrics.csv with a row cut short (a traceback from the script before): one `error:` line naming the file."""
    import runpy

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "metrics.csv").write_text("epoch,step,val_CIDEr\n1,10,0.3\n2,20\n")
    monkeypatch.setattr(sys, "argv", [SCRIPT[1], str(tmp_path / "curves.png"), f"{tmp_path / 'a'}:t1"])
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(SCRIPT[1], run_name="__main__")
    assert stopped.value.code == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'a' / 'metrics.csv'}: line 3 has 2 cells, its header 3\n"
    assert not (tmp_path / "curves.png").exists()


def test_the_script_names_a_validation_column_a_run_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """--val of a metric a run never scored drew an empty panel beside the other runs' curves, as if it had."""
    import runpy

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "metrics.csv").write_text("epoch,step,val_CIDEr,val_Bleu_4\n1,10,0.3,0.1\n")
    monkeypatch.setattr(sys, "argv",
                        [SCRIPT[1], str(tmp_path / "curves.png"), f"{tmp_path / 'a'}:t1", "--val", "SPICE"])
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(SCRIPT[1], run_name="__main__")
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'a' / 'metrics.csv'}: no val_SPICE column for --val SPICE "
                                       "(it has: Bleu_4, CIDEr)\n")
    assert not (tmp_path / "curves.png").exists()
