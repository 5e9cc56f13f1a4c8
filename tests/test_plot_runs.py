"""scripts/plot_runs.py: curves of several runs from their metrics.csv, and a one-line error for a wrong run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_run(folder: Path, rewards: list[float]) -> None:
    folder.mkdir()
    rows = ["epoch,step,val_CIDEr,seconds,train_loss,train_reward", "0,0,0.30,1.0,,"]
    rows += [f"{e},{10 * e},{0.30 + 0.01 * e},5.0,-0.5,{r}" for e, r in enumerate(rewards, start=1)]
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")


def test_plots_runs_and_names_a_missing_one(tmp_path: Path) -> None:
    write_run(tmp_path / "a", [0.3, 0.4])
    write_run(tmp_path / "b", [0.7, 0.8, 0.9])
    out = tmp_path / "fig" / "curves.png"
    script = [sys.executable, str(ROOT / "scripts" / "plot_runs.py")]
    done = subprocess.run([*script, str(out), f"{tmp_path / 'a'}:temperature 1", f"{tmp_path / 'b'}:temperature 0.5"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    missing = subprocess.run([*script, str(out), f"{tmp_path / 'nowhere'}:x"], capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode != 0
    assert missing.stderr.strip() == f"error: {tmp_path / 'nowhere' / 'metrics.csv'}: no metrics.csv (is {tmp_path / 'nowhere'} a train.out_dir?)"
