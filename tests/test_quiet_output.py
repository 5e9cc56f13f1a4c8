"""What the commands print: by default what the user acts on (a line per epoch, the result,
where the files went, the next command); the diagnostics only with -v; no progress-bar frames
in a log file.

The commands run as subprocesses with their output to pipes, as in a log file, on a tiny shapes
world trained here (seconds).
"""

from __future__ import annotations

import io
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, SHAPES_TINY
from helpers import subprocess_env
from test_scripts import run_quickstart
import warm_start

from captioner.apps.cli import build_parser
from captioner.core.progress import progress_bar

# Lines that are diagnostics: each must stay out of a default run's output and (where the
# command makes it) come with -v.
TRAIN_DIAGNOSTICS = ("global batch", "steps in ", "calibrat", "products:")
EVALUATE_DIAGNOSTICS = ("PTB tokenizer", "paraphrase entries", "not comparable", "nltk_corpus_BLEU", "BLEU's factors",
                        "processes,")

EPOCHS = 2
TINY = [*(o for o in SHAPES_TINY if not o.startswith(("train.epochs", "data.shapes_num_"))),
        "data.shapes_num_train=32", "data.shapes_num_val=8", "data.shapes_num_test=4", f"train.epochs={EPOCHS}"]


@dataclass
class Output:
    out: str
    err: str

    @property
    def both(self) -> str:
        return self.out + self.err


def captioner(*args: str) -> Output:
    """`captioner ARGS` with stdout and stderr to pipes (not a terminal); it must succeed."""
    command = [sys.executable, "-m", "captioner", *args]
    result = warm_start.run(command, cwd=REPO, capture_output=True, env=subprocess_env(), timeout=600)
    # Decoded here: text mode's universal newlines would turn a bar's carriage returns into newlines.
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 0, err[-3000:]
    return Output(out, err)


@dataclass
class Trained:
    root: Path
    default: Output  # `captioner train` as a user runs it
    verbose: Output  # the same with -v after the command

    @property
    def checkpoint(self) -> Path:
        return self.root / "run" / "best.pt"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    root = tmp_path_factory.mktemp("quiet")
    config = str(REPO / "configs/shapes_lstm.yaml")
    data = f"data.root={root / 'shapes'}"
    default = captioner("train", config, *TINY, data, f"train.out_dir={root / 'run'}")
    verbose = captioner("train", config, *TINY, data, "train.epochs=1", f"train.out_dir={root / 'run_v'}", "-v")
    return Trained(root, default, verbose)


def found(text: str, markers: tuple[str, ...]) -> list[str]:
    return [m for m in markers if m in text]


@pytest.mark.slow
@pytest.mark.xdist_group("quiet_trained")  # one worker trains the module's runs once
def test_train_prints_a_line_per_epoch_and_the_next_command(trained: Trained) -> None:
    output = trained.default
    assert "\r" not in output.both  # no progress-bar frames in a log file
    assert found(output.both, TRAIN_DIAGNOSTICS) == []
    epochs = [line for line in output.both.splitlines() if re.match(r"epoch \d+/\d+ ", line)]
    assert len(epochs) == EPOCHS
    next_command = shlex.join(["captioner", "evaluate", str(trained.checkpoint), "--split", "test"])
    assert output.out.strip().splitlines()[-1] == f"next: {next_command}"
    assert len(output.both.splitlines()) <= EPOCHS + 5  # the world, the data, the epochs, the best, the next command


@pytest.mark.slow
@pytest.mark.xdist_group("quiet_trained")  # one worker trains the module's runs once
def test_train_with_v_adds_the_diagnostics(trained: Trained) -> None:
    assert "\r" not in trained.verbose.both
    assert found(trained.verbose.err, ("global batch", "steps in ")) == ["global batch", "steps in "]


@pytest.mark.slow
@pytest.mark.xdist_group("quiet_trained")  # one worker trains the module's runs once
def test_evaluate_prints_scores_files_and_the_next_command_and_diagnostics_with_v(trained: Trained, java: str) -> None:
    default = captioner("evaluate", str(trained.checkpoint), "--split", "test", "--limit", "4")
    assert "\r" not in default.both
    assert found(default.both, EVALUATE_DIAGNOSTICS) == []
    lines = default.out.strip().splitlines()
    run = trained.root / "run"
    assert lines[-3:-1] == [f"captions: {run / 'results_test.json'}", f"scores: {run / 'scores_test.json'}"]
    image = trained.root / "shapes" / "test" / "test_000000.jpg"
    words = ["captioner", "caption", str(trained.checkpoint), str(image), "--heatmaps", str(run / "heatmaps")]
    assert lines[-1] == "next: " + shlex.join(words)  # a command to paste: a folder with a space is quoted
    verbose = captioner("-v", "evaluate", str(trained.checkpoint), "--split", "test", "--limit", "4")
    assert found(verbose.both, EVALUATE_DIAGNOSTICS) == list(EVALUATE_DIAGNOSTICS)


@pytest.mark.parametrize("argv", [["-v", "config", "keys", "train.lr"], ["config", "keys", "train.lr", "-v"],
                                  ["-q", "config", "keys"], ["config", "keys", "--quiet"], ["config", "keys"]])
def test_v_and_q_go_before_or_after_the_command(argv: list[str]) -> None:
    expected = 1 if {"-v"} & set(argv) else -1 if {"-q", "--quiet"} & set(argv) else 0
    assert build_parser().parse_args(argv).verbosity == expected


def test_a_command_option_of_the_same_name_stays_the_commands() -> None:
    args = build_parser().parse_args(["data", "shapes", "--out", "world", "--quiet", "-v"])
    assert args.quiet is True and args.verbosity == 1  # `data shapes --quiet`: no progress bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bars_draw_on_a_terminal_only() -> None:
    log_file = io.StringIO()
    list(progress_bar(range(3), file=log_file, desc="epoch 1"))
    assert log_file.getvalue() == ""
    terminal = Terminal()
    list(progress_bar(range(3), file=terminal, desc="epoch 1"))
    assert "epoch 1" in terminal.getvalue()
    terminal = Terminal()
    list(progress_bar(range(3), file=terminal, enabled=False))
    assert terminal.getvalue() == ""


def test_quickstart_ends_with_what_next(tmp_path: Path) -> None:
    result, _ = run_quickstart(tmp_path, java=True)
    assert result.returncode == 0, result.stderr
    closing = result.stdout.strip().splitlines()
    start = closing.index(next(line for line in closing if line.startswith("What next")))
    commands = " ".join(closing[start:])
    assert "captioner caption photo.jpg" in commands and "captioner demo" in commands and "docs/training.md" in commands
