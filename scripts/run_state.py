"""Where a run folder of a sweep stands, in one word, for the sweep scripts (scripts/sweep_runs.sh), which go on from
there when run again:

    new      no last.pt: train it
    stopped  a last.pt, but its training did not finish (a signal, an error, a kill): continue it with --resume
    trained  its training finished (finished.json; for a run trained before that file was written, its history
             ends where its config ends training), and no scores were written since: evaluate it
    scored   its training finished, and its scores file was written after: nothing left to do

    python scripts/run_state.py RUN [--scores scores_test.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

from captioner.apps.arguments import AnyOrderParser
from captioner.training.history import FINISHED, METRICS, ended_by_its_history, training_finished


def run_state(run: Path, scores: str = "scores_test.json") -> str:
    """new, stopped, trained or scored (see the module's docstring)."""
    if training_finished(run):
        ended = run / FINISHED
    elif not (run / "last.pt").is_file():
        return "new"
    elif ended_by_its_history(run) is not None:
        ended = run / METRICS  # written last as that training ended
    else:
        return "stopped"
    scored = run / scores
    fresh = scored.is_file() and scored.stat().st_mtime_ns >= ended.stat().st_mtime_ns
    return "scored" if fresh else "trained"


def main(argv: list[str] | None = None) -> int:
    parser = AnyOrderParser(description="Say where a run folder stands: new, stopped, trained or scored.")
    parser.add_argument("run", type=Path, help="the run folder (train.out_dir)")
    parser.add_argument("--scores", default="scores_test.json",
                        help="the scores file `captioner evaluate` writes into the run folder (default %(default)s)")
    args = parser.parse_args(argv)
    # "new" would send a sweep to train into a file
    blocked = next((path for path in (args.run, *args.run.parents) if path.exists() and not path.is_dir()), None)
    if blocked is not None:
        print(f"error: {args.run}: not a run folder ({blocked} is a file)", file=sys.stderr)
        return 2
    print(run_state(args.run, args.scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
