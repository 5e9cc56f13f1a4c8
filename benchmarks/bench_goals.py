"""The CPU speed goals checked on this processor in one run: each measured by its own benchmark in a
fresh process, its output shown as it runs, then every goal beside its target.

    python -m benchmarks goals [--runs 3] [--threads N] [--skip demo] [--quickstart] [--beside TEXT] [--record ID]

- the LSTM training step and beam search against the Show-Attend-Tell tutorial's (`reference`, run
  --runs times, as the host's speed wanders; the median run is judged): >= 6x and >= 20x;
- the same two against their rooflines (`roofline`): within 1.5x and 2x;
- the demo serving the packaged model to 6 clients x 48 requests, a quarter of them broken files
  (`demo_load`): >= 6 captions/s at p95 <= 2 s;
- with --quickstart, the README's first command, `bash scripts/quickstart.sh`, in a fresh clone of this
  checkout's last commit (a folder named captioner, its own virtual environment, the packages from the
  index; the user's caches as they are): <= 8 minutes, test BLEU-4 >= 0.9.
A goal that could not be measured (no tutorial checkout, no Flickr8k photos) says why; one whose benchmark
failed (a served caption unlike the local one fails `demo_load`) is missed. --record ID writes the row as record
ID of docs/results/bench_goals.json, with this run's command, commit, processor and date; with --quickstart, the
quickstart's time, epochs and test scores as record ID of docs/results/quickstart.json too."""

from __future__ import annotations

import csv
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from captioner.apps.arguments import positive_int
from captioner.core.config_sections import thread_count

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.records import RESULTS, add_record_options, check_record_option, command_line, record_run  # noqa: E402
from benchmarks.shared_data import FLICKR8K_PHOTOS  # noqa: E402
from benchmarks.timing import argument_parser, child_json, print_environment, run_main  # noqa: E402
from captioner.models.model_paths import packaged_models  # noqa: E402

TRAIN_RATIO, BEAM_RATIO = 6.0, 20.0  # times the tutorial's speed, at least
TRAIN_ROOFLINE, BEAM_ROOFLINE = 1.5, 2.0  # times the roofline time, at most
DEMO_RATE, DEMO_P95 = 6.0, 2.0  # captions/s at least, seconds at most
QUICKSTART_S, QUICKSTART_BLEU4 = 8 * 60, 0.9  # the README's first command: seconds at most, test BLEU-4 at least
REPOSITORY = Path(__file__).resolve().parents[1]
FAILED = "it failed: "  # how `measured` words a benchmark that stopped with an error
NOT_RUN = "not run (--quickstart runs it in a fresh clone)"
DEMO_LOAD = ["--clients", "6", "--requests", "48", "--broken-every", "4"]
PATHS = {"--reference": "TUTORIAL"}  # the options whose value is a path: written so in a record
# bench_goals.json's columns, in the order of `goals`
COLUMNS = ("train", "beam", "train_roofline", "beam_roofline", "demo", "quickstart")
NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six")

Runner = Callable[[str, Sequence[str]], dict]


@dataclass(frozen=True)
class Goal:
    """One goal's row: what, its target, what was measured (or why nothing was), and whether it was met
    (None: not measured)."""

    what: str
    target: str
    measured: str
    met: bool | None


def spread(values: Sequence[float], unit: str = "x") -> str:
    """The median of `values`, and their range when there are several: '8.79x (8.40-9.15x, 3 runs)'."""
    middle = statistics.median(values)
    if len(values) == 1:
        return f"{middle:.2f}{unit}"
    return f"{middle:.2f}{unit} ({min(values):.2f}-{max(values):.2f}{unit}, {len(values)} runs)"


def unmeasured(what: str, target: str, why: str) -> Goal:
    """A goal without numbers: missed when its benchmark failed (`demo_load` fails when a served caption differs
    from the one made locally), else neither met nor missed, with the reason."""
    if why.startswith(FAILED):
        return Goal(what, target, why, False)
    return Goal(what, target, f"not measured: {why}", None)


def ratio_goal(what: str, runs: list[dict | str], key: str, least: float) -> Goal:
    """A goal on the tutorial's ratio, judged on the median of the runs that had the tutorial beside them
    (a run is its numbers, or how it failed)."""
    values = [run[key] for run in runs if isinstance(run, dict) and run.get(key) is not None]
    if not values:
        failed = [run for run in runs if isinstance(run, str)]
        why = failed[0] if failed else "the tutorial's checkout was not found (--reference)" if runs else "left out"
        return unmeasured(what, f">= {least:g}x", why)
    return Goal(what, f">= {least:g}x", spread(values), statistics.median(values) >= least)


def roofline_goal(what: str, roofline: dict | str, name: str, most: float) -> Goal:
    """A goal on a piece of work's time over its roofline time (`roofline`: its numbers, or why there are none)."""
    if isinstance(roofline, str):
        return unmeasured(what, f"<= {most:g}x", roofline)
    work = roofline["work"][name]
    return Goal(what, f"<= {most:g}x", f"{work['ratio']:.2f}x ({work['seconds'] * 1e3:,.0f} ms against "
                f"{work['roofline_seconds'] * 1e3:,.0f} ms)", work["ratio"] <= most)


def demo_goal(demo: dict | str) -> Goal:
    what, target = "the demo with the packaged model", f">= {DEMO_RATE:g} captions/s, p95 <= {DEMO_P95:g} s"
    if isinstance(demo, str):
        return unmeasured(what, target, demo)
    return Goal(what, target, f"{demo['captions_per_s']:.2f} captions/s, p95 {demo['p95']:.2f} s",
                demo["captions_per_s"] >= DEMO_RATE and demo["p95"] <= DEMO_P95)


def quickstart_goal(quickstart: dict | str) -> Goal:
    what = "the quickstart in a fresh clone"
    target = f"<= {QUICKSTART_S // 60} min, test BLEU-4 >= {QUICKSTART_BLEU4:g}"
    if isinstance(quickstart, str):
        return unmeasured(what, target, quickstart)
    minutes, seconds = divmod(round(quickstart["seconds"]), 60)
    return Goal(what, target, f"{minutes} min {seconds} s, test BLEU-4 {quickstart['bleu4']:.3f}",
                quickstart["seconds"] <= QUICKSTART_S and quickstart["bleu4"] >= QUICKSTART_BLEU4)


def goals(reference: list[dict | str], roofline: dict | str, demo: dict | str,
          quickstart: dict | str = NOT_RUN) -> list[Goal]:
    """Every goal's row from the benchmarks' numbers (each: its numbers, or why there are none)."""
    return [
        ratio_goal("LSTM training step against the tutorial's", reference, "train_ratio", TRAIN_RATIO),
        ratio_goal("beam search against the tutorial's (images/s)", reference, "beam_ratio", BEAM_RATIO),
        roofline_goal("LSTM training step against its roofline", roofline, "lstm_train", TRAIN_ROOFLINE),
        roofline_goal("beam search against its roofline", roofline, "lstm_beam", BEAM_ROOFLINE),
        demo_goal(demo),
        quickstart_goal(quickstart),
    ]


def table(rows: list[Goal]) -> str:
    marks = {True: "met", False: "MISSED", None: "-"}
    lines = ["| goal | target | measured | |", "|---|---|---|---|"]
    lines += [f"| {g.what} | {g.target} | {g.measured} | {marks[g.met]} |" for g in rows]
    return "\n".join(lines)


def verdict(rows: list[Goal]) -> str:
    """'all six met', or how many of the measured goals were met and which were missed."""
    judged = [row for row in rows if row.met is not None]
    missed = [row.what for row in judged if not row.met]
    if not judged:
        return "none measured"
    if not missed:
        return "the one measured met" if len(judged) == 1 else f"all {NUMBER_WORDS[len(judged)]} met"
    return f"{len(judged) - len(missed)} of {len(judged)} met; missed: {'; '.join(missed)}"


def record_numbers(rows: list[Goal]) -> dict[str, str]:
    """The row as bench_goals.json's numbers: each goal measured (or failed) under its column, and the verdict."""
    numbers = {key: row.measured for key, row in zip(COLUMNS, rows, strict=True) if row.met is not None}
    return {**numbers, "verdict": verdict(rows)}


def why_no_demo() -> str:
    """'' when the demo can be measured; else what it lacks."""
    if importlib.util.find_spec("gradio") is None or importlib.util.find_spec("gradio_client") is None:
        return "the demo extra is not installed (pip install -e '.[demo]')"
    if not packaged_models():
        return "no packaged model in captioner/pretrained"
    if not any(FLICKR8K_PHOTOS.glob("*.jpg")):
        return f"no Flickr8k photos in {FLICKR8K_PHOTOS} ($CAPTIONER_SHARED_DATA)"
    return ""


def quickstart_run(repository: Path = REPOSITORY) -> dict:
    """`bash scripts/quickstart.sh` in a fresh clone of `repository`'s last commit, its output passed through
    as it runs -> {"seconds": its wall time, "bleu4": the test split's}; a failure raises SystemExit in one line."""
    with tempfile.TemporaryDirectory(prefix="captioner-goals-") as folder:
        clone = Path(folder) / "captioner"  # the folder `git clone` makes
        cloned = subprocess.run(["git", "clone", "-q", str(repository), str(clone)], capture_output=True, text=True)
        if cloned.returncode != 0:
            raise SystemExit(f"git clone {repository}: {cloned.stderr.strip()[-300:]}")
        started = time.perf_counter()
        code = subprocess.run(["bash", "scripts/quickstart.sh"], cwd=clone).returncode
        seconds = time.perf_counter() - started
        if code != 0:
            raise SystemExit(f"bash scripts/quickstart.sh: exit {code}: its output is above")
        run = clone / "runs" / "shapes_lstm"
        scores = json.loads((run / "scores_test.json").read_text(encoding="utf-8"))["overall"]
        with open(run / "metrics.csv", newline="", encoding="utf-8") as f:
            epochs = [float(row["seconds"]) for row in csv.DictReader(f)]
        return {"seconds": seconds, "bleu4": scores["Bleu_4"], "meteor": scores["METEOR"], "cider": scores["CIDEr"],
                "epoch_seconds": epochs}


def quickstart_numbers(timed: dict) -> dict[str, str]:
    """`quickstart_run`'s numbers under quickstart.json's columns."""
    minutes, seconds = divmod(round(timed["seconds"]), 60)
    epochs = timed["epoch_seconds"]
    return {"time": f"{minutes} min {seconds} s", "epoch": f"{min(epochs):.0f}-{max(epochs):.0f} s",
            **{key: f"{timed[key]:.3f}" for key in ("bleu4", "meteor", "cider")}}


def measured(run: Runner, name: str, args: Sequence[str]) -> dict | str:
    """A benchmark's numbers, or one line saying how it failed (the other goals are still measured)."""
    print(f"\n=== python -m benchmarks {name} {' '.join(args)}", flush=True)
    try:
        return run(name, args)
    except SystemExit as e:
        return f"{FAILED}{e}"


def main(argv: list[str] | None = None, run: Runner | None = None,
         quickstart: Callable[[], dict] = quickstart_run, results: Path = RESULTS) -> int:
    parser = argument_parser("goals", __doc__)
    parser.add_argument("--runs", type=positive_int, default=3, help="runs of the tutorial comparison (default: 3)")
    parser.add_argument("--threads", type=thread_count, default=None,
                        help="torch threads of every measure (default: as captioner.core.process_settings sets them)")
    parser.add_argument("--reference", default=None, help="the tutorial's checkout (see `reference --help`)")
    parser.add_argument("--skip", nargs="+", choices=("reference", "roofline", "demo"), default=[],
                        help="leave these measures out")
    parser.add_argument("--quickstart", action="store_true",
                        help="also time `bash scripts/quickstart.sh` in a fresh clone of the last commit (minutes, and "
                             "the package index for its virtual environment)")
    add_record_options(parser, "bench_goals", "the goals")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    check_record_option(parser, args, "bench_goals", results)
    if args.quickstart:
        check_record_option(parser, args, "quickstart", results)
    run = run or (lambda name, options: child_json(name, options, what=f"benchmarks {name}", echo=True))
    print_environment(args)
    reported = ["--beside", args.beside or "not said", "--json"]
    common = reported + (["--threads", str(args.threads)] if args.threads is not None else [])
    reference: list[dict | str] = []
    if "reference" not in args.skip:
        # absolute: the benchmarks run in the repository (timing.child_json), not in the folder the user named it from
        there = ["--reference", str(Path(args.reference).absolute())] if args.reference else []
        options = [*common, "--repeats", "7", *there]
        reference = [measured(run, "reference", options) for _ in range(args.runs)]
    roofline: dict | str = "left out (--skip roofline)"
    if "roofline" not in args.skip:
        roofline = measured(run, "roofline", [*common, "--repeats", "5", "--only", "lstm_train", "lstm_beam"])
    demo: dict | str = "left out (--skip demo)"
    if "demo" not in args.skip:
        demo = why_no_demo() or measured(run, "demo_load", [str(packaged_models()[0]), *DEMO_LOAD, *reported])
    timed: dict | str = NOT_RUN
    if args.quickstart:
        print(f"\n=== bash scripts/quickstart.sh in a fresh clone of {REPOSITORY}'s last commit", flush=True)
        try:
            timed = quickstart()
        except SystemExit as e:
            timed = f"{FAILED}{e}"
    rows = goals(reference, roofline, demo, timed)
    print("\n" + table(rows))
    if args.record:
        command = command_line("goals", argv, PATHS)
        record_run("bench_goals", args, record_numbers(rows), command, results)
        if isinstance(timed, dict):
            record_run("quickstart", args, quickstart_numbers(timed), command, results,
                       note="bash scripts/quickstart.sh in a fresh clone of the last commit, timed by the goals")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
