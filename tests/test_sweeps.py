"""The Flickr8k sweeps (scripts/flickr8k_experiments.sh, flickr8k_backbones.sh, flickr8k_full.sh), run again, carry
on where they stopped (scripts/sweep_runs.sh, scripts/run_state.py): a model trained and scored is skipped with a
note, a training run cut short resumes from its last.pt, one whose training finished but whose scoring did not is only
scored. Each runs the real script in a copy of scripts/ with a `captioner` that records its calls and writes what the
real one writes (refusing, as it does, a new run into a folder that holds one), in well under a second a run."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# `captioner` as the sweeps see it: train writes best.pt, last.pt and, unless CUT_SHORT names the run, finished.json;
# without --resume it refuses a folder that holds a checkpoint (apps/prerequisites.require_no_run); evaluate writes
# the scores file, unless EVALUATION_FAILS names the run.
CAPTIONER = """
import os, sys
from pathlib import Path
from captioner.training.history import FINISHED
args = sys.argv[1:]
with open(os.environ["CALLS"], "a") as calls:
    calls.write(" ".join(args) + "\\n")
if args[0] == "train":
    run = Path(next(a.partition("=")[2] for a in args if a.startswith("train.out_dir=")))
    held = [name for name in ("best.pt", "last.pt") if (run / name).is_file()]
    if "--resume" not in args and held:
        sys.exit(f"error: train.out_dir={run} already holds a run ({', '.join(held)})")
    if "--resume" in args and not (run / "last.pt").is_file():
        sys.exit(f"error: {run}/last.pt: nothing to resume")
    (run / "features").mkdir(parents=True, exist_ok=True)
    for name in ("best.pt", "last.pt"):
        (run / name).write_text("a checkpoint")
    if run.name == os.environ.get("CUT_SHORT"):
        sys.exit(143)  # SIGTERM: last.pt saved, no finished.json
    (run / FINISHED).write_text("{}")
elif args[0] == "evaluate":
    out = Path(args[args.index("--out") + 1])
    if out.name == os.environ.get("EVALUATION_FAILS"):
        sys.exit("error: the evaluation failed")
    (out / "scores_test.json").write_text("{}")
"""
# The Python scripts a sweep runs besides: their calls recorded; compare_decoding.py's dev sweep of one variant.
SCRIPT = """
import json, os, sys
from pathlib import Path
with open(os.environ["CALLS"], "a") as calls:
    calls.write(" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) + "\\n")
if "--json" in sys.argv:
    variant = {"overall": {"CIDEr": 1.0}, "options": {"length_penalty": 0.5}}
    Path(sys.argv[sys.argv.index("--json") + 1]).write_text(json.dumps({"variants": [variant]}))
"""


def sweep_copy(tmp_path: Path, script: str) -> Path:
    """A copy of the repository holding `script`, the sweeps' shared helpers and stand-ins for the rest, whose
    .venv puts the recording `captioner` and this interpreter (the checkout's captioner importable) first."""
    repo, bin_dir = tmp_path / "repo", tmp_path / "bin"
    (repo / "scripts").mkdir(parents=True)
    for name in (script, "sweep_runs.sh", "run_state.py"):
        shutil.copy(ROOT / "scripts" / name, repo / "scripts")
    for name in ("results_table.py", "paired_bootstrap.py", "compare_decoding.py"):
        (repo / "scripts" / name).write_text(SCRIPT)
    bin_dir.mkdir()
    (bin_dir / "recording_captioner.py").write_text(CAPTIONER)
    python = f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(ROOT))} exec {shlex.quote(sys.executable)}"
    (bin_dir / "python").write_text(f'{python} "$@"\n')
    (bin_dir / "captioner").write_text(f'{python} {shlex.quote(str(bin_dir / "recording_captioner.py"))} "$@"\n')
    for tool in ("python", "captioner"):
        (bin_dir / tool).chmod(0o755)
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "bin" / "activate").write_text(f'PATH="{bin_dir}:$PATH"\n')
    return repo


def sweep(repo: Path, script: str, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run the sweep; what it printed, and its calls in short: 'train RUN [--resume]', 'evaluate RUN', 'SCRIPT'."""
    calls = repo.parent / "calls.txt"
    calls.unlink(missing_ok=True)
    result = subprocess.run(["bash", str(repo / "scripts" / script), *args], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "CALLS": str(calls), **env})
    return result, [short(line.split()) for line in (calls.read_text().splitlines() if calls.exists() else [])]


def short(words: list[str]) -> str:
    if words[0] == "train":
        run = Path(next(w.partition("=")[2] for w in words if w.startswith("train.out_dir="))).name
        return f"train {run}" + (" --resume" if "--resume" in words else "")
    if words[0] == "evaluate":
        return f"evaluate {Path(words[words.index('--out') + 1]).name}"
    return words[0]


def test_flickr8k_experiments_run_again_go_on_where_they_stopped(tmp_path: Path) -> None:
    repo = sweep_copy(tmp_path, "flickr8k_experiments.sh")
    lstm, blind, transformer = "flickr8k_lstm_lite0", "flickr8k_lstm_lite0_blind", "flickr8k_transformer_lite0"
    result, calls = sweep(repo, "flickr8k_experiments.sh", "data", EVALUATION_FAILS=blind)
    assert result.returncode != 0 and calls == [f"train {lstm}", f"evaluate {lstm}", f"train {blind}",
                                                f"evaluate {blind}"], result.stderr

    # trained and scored: skipped; trained, not scored: scored alone; then a training run cut short by a signal
    result, calls = sweep(repo, "flickr8k_experiments.sh", "data", CUT_SHORT=transformer)
    assert result.returncode != 0 and calls == [f"evaluate {blind}", f"train {transformer}"], result.stderr
    assert f"== runs/{lstm}: finished (trained, then scored): skipped\n" in result.stdout
    assert f"== runs/{blind}: trained already (its training finished), not trained again\n" in result.stdout

    result, calls = sweep(repo, "flickr8k_experiments.sh", "data")
    assert result.returncode == 0, result.stderr
    assert calls == [f"train {transformer} --resume", f"evaluate {transformer}",
                     f"train {lstm}_scst", f"evaluate {lstm}_scst",
                     f"train {transformer}_scst", f"evaluate {transformer}_scst", "results_table.py"]
    assert f"== runs/{transformer}: cut short, resuming from its last.pt\n" in result.stdout

    result, calls = sweep(repo, "flickr8k_experiments.sh", "data")  # all done: the table alone
    assert result.returncode == 0 and calls == ["results_table.py"], result.stderr
    assert result.stdout.count(": finished (trained, then scored): skipped\n") == 5, result.stdout


def test_flickr8k_backbones_run_again_go_on_where_they_stopped(tmp_path: Path) -> None:
    repo, runs = sweep_copy(tmp_path, "flickr8k_backbones.sh"), tmp_path / "runs"
    result, calls = sweep(repo, "flickr8k_backbones.sh", "data", str(runs), CUT_SHORT="flickr8k_lstm_lite1")
    assert result.returncode != 0 and calls == ["train flickr8k_lstm_lite0", "evaluate flickr8k_lstm_lite0",
                                                "train flickr8k_lstm_lite1"], result.stderr
    assert "lite0: trained in " in result.stdout

    result, calls = sweep(repo, "flickr8k_backbones.sh", "data", str(runs))
    assert result.returncode == 0, result.stderr
    assert calls == ["train flickr8k_lstm_lite1 --resume", "evaluate flickr8k_lstm_lite1",
                     "train flickr8k_lstm_lite2", "evaluate flickr8k_lstm_lite2",
                     "paired_bootstrap.py", "paired_bootstrap.py", "results_table.py"]
    assert f"== {runs}/flickr8k_lstm_lite0: finished (trained, then scored): skipped\n" in result.stdout
    assert "lite0: trained in" not in result.stdout and " s since its resume;" in result.stdout  # no time of a skip


def test_flickr8k_full_resumes_a_training_run_cut_short_and_skips_a_finished_one(tmp_path: Path) -> None:
    repo, out = sweep_copy(tmp_path, "flickr8k_full.sh"), tmp_path / "out"
    (repo / "data").mkdir()
    (repo / "data" / "Flickr8k.token.txt").write_text("")
    result, calls = sweep(repo, "flickr8k_full.sh", "data", "", "lstm", OUT=str(out), CUT_SHORT="lstm")
    assert result.returncode != 0 and calls == ["train lstm"], result.stderr

    result, calls = sweep(repo, "flickr8k_full.sh", "data", "", "lstm", OUT=str(out))
    assert result.returncode == 0, result.stderr
    assert calls == ["train lstm --resume", "compare_decoding.py", "evaluate lstm"]
    assert [row.split("\t")[::4] for row in (out / "timings.tsv").read_text().splitlines()] == [
        ["train lstm", "143"], ["train lstm", "0"], ["dev lstm", "0"], ["test lstm", "0"]]

    result, calls = sweep(repo, "flickr8k_full.sh", "data", "", "lstm", OUT=str(out))
    assert result.returncode == 0 and calls == [], result.stderr
    assert f"== {out}/lstm: finished (trained, then scored): skipped\n== lstm: scored\n" in result.stdout


def run_state_module():
    spec = importlib.util.spec_from_file_location("run_state_under_test", ROOT / "scripts" / "run_state.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_folder_is_new_stopped_trained_or_scored_by_what_its_commands_wrote(tmp_path: Path) -> None:
    """finished.json, written as training ends, tells a finished run from one cut short (not the epochs: early
    stopping and the time limit end a run early); a scores file counts only if written after it."""
    state = run_state_module().run_state
    run = tmp_path / "run"
    assert state(run) == "new"
    run.mkdir()
    (run / "best.pt").write_text("")
    assert state(run) == "new"  # no last.pt to resume: `captioner train` says what to do
    (run / "last.pt").write_text("")
    assert state(run) == "stopped"
    (run / "scores_test.json").write_text("{}")  # scored before the training finished: not this model's scores
    (run / "finished.json").write_text("{}")
    os.utime(run / "scores_test.json", ns=(0, (run / "finished.json").stat().st_mtime_ns - 1))
    assert state(run) == "trained"
    (run / "scores_test.json").write_text("{}")
    assert state(run) == "scored" and state(run, "scores_val.json") == "trained"


def old_run(run: Path, epochs: int, patience: int, scores: list[float], mid_epoch: bool = False) -> Path:
    """A run folder as training wrote it before finished.json: last.pt, config.yaml (`epochs`, early stopping's
    `patience`) and metrics.csv, a row of val Bleu_4 `scores` per epoch (and with `mid_epoch` one more, mid-epoch)."""
    from captioner.core.config import dump_config, load_config
    from captioner.training.history import write_history

    run.mkdir()
    (run / "last.pt").write_text("a checkpoint")
    dump_config(load_config(None, [f"train.epochs={epochs}", f"train.early_stopping_patience={patience}"]),
                run / "config.yaml")
    rows = [{"epoch": e, "step": 10 * e, "val_Bleu_4": score} for e, score in enumerate(scores, 1)]
    if mid_epoch:
        rows.append({"epoch": len(scores) + 1, "step": 10 * len(scores) + 5, "epochs_done": len(scores) + 0.5,
                     "val_Bleu_4": 0.1})
    write_history(run / "metrics.csv", rows)
    return run


def test_a_run_from_before_finished_json_is_trained_where_its_history_ends_the_training(tmp_path: Path) -> None:
    """No finished.json, but a history ending where its config ends training (all epochs done, or early stopping's
    patience spent): trained, then scored once its scores are written after that history; a run with epochs to go,
    stopped mid-epoch, or whose files cannot be read is stopped (its --resume trains no step where it had ended). Of
    equal scores the latest counts as the best: a run said to be trained has ended by its last.pt too."""
    state = run_state_module().run_state
    assert state(old_run(tmp_path / "done", 3, 0, [0.1, 0.2, 0.3])) == "trained"
    early = old_run(tmp_path / "early", 10, 2, [0.1, 0.3, 0.2, 0.25])
    assert state(early) == "trained"
    os.utime(early / "metrics.csv", ns=(0, 0))
    (early / "scores_test.json").write_text("{}")
    assert state(early) == "scored"
    assert state(old_run(tmp_path / "patient", 10, 3, [0.1, 0.3, 0.2, 0.25])) == "stopped"
    assert state(old_run(tmp_path / "tied", 10, 2, [0.1, 0.3, 0.2, 0.3])) == "stopped"
    assert state(old_run(tmp_path / "mid", 10, 2, [0.1, 0.3, 0.2, 0.25], mid_epoch=True)) == "stopped"
    assert state(old_run(tmp_path / "no_stopping", 10, 0, [0.1, 0.3, 0.2, 0.25])) == "stopped"
    broken = old_run(tmp_path / "broken", 3, 0, [0.1, 0.2, 0.3])
    (broken / "config.yaml").write_text("train: [")
    assert state(broken) == "stopped"


DAMAGED_METRICS = {
    "a row cut short": ("epoch,step,val_Bleu_4\n1,10,0.1\n2,20\n", r"line 3 has 2 cells, its header 3$"),
    "a row with an extra cell": ("epoch,step,val_Bleu_4\n1,10,0.1,9\n", r"line 2 has 4 cells, its header 3$"),
    "a cell that is not a number": ("epoch,step,val_Bleu_4\n1,10,abc\n", r"line 2, column val_Bleu_4: 'abc' is not "
                                                                          r"a number$"),
    "an infinite epoch": ("epoch,step,val_Bleu_4\ninf,10,0.1\n", r"line 2, column epoch: inf is not a whole number "
                                                                 r"of 0 or more$"),
    "a negative step": ("epoch,step,val_Bleu_4\n1,-10,0.1\n", r"line 2, column step: -10\.0 is not a whole number"),
    "no epoch column": ("step,val_Bleu_4\n10,0.1\n", r"no epoch column \(its header: 'step,val_Bleu_4'\)$"),
    "not UTF-8": ("\udcff\udcfe", r"the run's metrics\.csv is not UTF-8 text"),
}


@pytest.mark.parametrize("case", DAMAGED_METRICS)
def test_a_damaged_history_is_one_line_and_a_run_stopped_to_the_sweeps(case: str, tmp_path: Path) -> None:
    """A metrics.csv cut short, with a cell that is no number or whole epoch, a missing column, or not text: one
    CaptionerError naming the file, the line and the column (scripts/plot_runs.py prints it), and to the sweeps
    a run that cannot be read, so stopped (a traceback before)."""
    from captioner.core.errors import CaptionerError
    from captioner.training.history import ended_by_its_history, read_history

    text, said = DAMAGED_METRICS[case]
    run = old_run(tmp_path / "run", 3, 0, [0.1, 0.2, 0.3])
    (run / "metrics.csv").write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(CaptionerError, match=rf"^{re.escape(str(run / 'metrics.csv'))}: {said}"):
        read_history(run / "metrics.csv")
    assert ended_by_its_history(run) is None
    assert run_state_module().run_state(run) == "stopped"


@pytest.mark.parametrize("config", ["- a list\n", "7\n", "pipe", "/dev/zero"])
def test_a_run_config_that_is_no_mapping_or_no_file_is_a_history_that_cannot_be_read(config: str,
                                                                                     tmp_path: Path) -> None:
    """config.yaml damaged into a list or a number, or a pipe or a device in its place (read, either would never
    end): to the sweeps a run that cannot be read, so stopped, at once."""
    import signal

    from captioner.training.history import ended_by_its_history

    run = old_run(tmp_path / "run", 3, 0, [0.1, 0.2, 0.3])
    (run / "config.yaml").unlink()
    if config == "pipe":
        os.mkfifo(run / "config.yaml")
    elif config.startswith("/dev/"):
        (run / "config.yaml").symlink_to(config)
    else:
        (run / "config.yaml").write_text(config)

    class Waited(Exception):  # not an OSError, which a damaged run's reading catches
        pass

    def waits(*args: object) -> None:
        raise Waited("config.yaml was read as a file that never ends")

    previous = signal.signal(signal.SIGALRM, waits)
    signal.setitimer(signal.ITIMER_REAL, 2)
    try:
        assert ended_by_its_history(run) is None
        assert run_state_module().run_state(run) == "stopped"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
