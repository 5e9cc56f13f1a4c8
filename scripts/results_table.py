"""Print a Markdown table of `captioner evaluate` score files (scores_<split>.json), one row per run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from captioner.apps.arguments import AnyOrderParser
from captioner.apps.cli import refused
from captioner.core.errors import CaptionerError
from captioner.evaluation.results_files import read_scores_file, score_fields

KEYS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")
HEADER = ("run", "images", "beam", *KEYS, "bad endings", "repeated bigrams", "grounding (uniform)")
RATES = ("bad_ending_rate", "repeated_bigram_rate")
GROUNDING = ("score", "uniform_baseline")


def read_scores(run: str, split: str) -> dict[str, Any]:
    """The run's scores file, its "overall" holding every metric of KEYS."""
    if Path(run).is_file():
        raise CaptionerError(f"{run}: a file, not a run folder (give the folder that holds scores_{split}.json)")
    path = Path(run) / f"scores_{split}.json"
    report = read_scores_file(path, f"run `captioner evaluate {run}/best.pt --split {split}` first")
    overall = report.get("overall")
    missing = [key for key in KEYS if key not in overall] if isinstance(overall, dict) else KEYS
    if missing:
        raise CaptionerError(f"{path}: no {', '.join(missing)} in \"overall\" (scored with --fast?)")
    score_fields(overall, f"{path}: overall", KEYS)
    for field, keys in (("caption_stats", RATES), ("grounding", GROUNDING)):
        if report.get(field):
            score_fields(report[field], f"{path}: {field}", keys)
    return report


def number(value: float | None, form: str = ".3f", scale: float = 1, unit: str = "") -> str:
    """A score as `form` says, times `scale`, then `unit`; "-" where it is null (not finite when it was written)."""
    return "-" if value is None else format(scale * value, form) + unit


def row(run: str, report: dict[str, Any]) -> str:
    overall = report["overall"]
    grounding = report.get("grounding")
    ground = f"{number(grounding['score'])} ({number(grounding['uniform_baseline'])})" if grounding else "-"
    stats = report.get("caption_stats")
    rates = [number(stats[k], ".1f", 100, "%") for k in RATES] if stats else ["-", "-"]
    cells = [Path(run).name, str(report.get("images", "-")), str(report.get("beam_size", "-")),
             *(number(overall[k]) for k in KEYS), *rates, ground]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = AnyOrderParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="a folder holding scores_<split>.json (`captioner evaluate --out RUN`)")
    parser.add_argument("--split", default="test", help="which scores file of each run (default: test)")
    args = parser.parse_args(argv)
    try:
        rows = [row(run, read_scores(run, args.split)) for run in args.runs]
    except CaptionerError as e:
        return refused(e)  # its one line, exit status 2
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
