"""The README's grounding and pointing-game table from `captioner evaluate --grounding
--saliency gradcam` score files: one row per map kind of each model, beside the baselines."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from captioner.apps.arguments import AnyOrderParser
from captioner.apps.cli import refused
from captioner.core.errors import CaptionerError
from captioner.evaluation.results_files import read_scores_file, score_fields

BASELINES = ("uniform_grounding", "random_point", "centre_point")
MAP_SCORES = ("grounding", "pointing")
HEAD = re.compile(r"L(\d+)H(\d+)")  # a map kind's name (evaluation/grounding.py): L0H1, L0 mean, mean, gradcam
LAYER_MEAN = re.compile(r"L(\d+) ?mean")


def per_head_table(path: Path) -> dict:
    """The per-map grounding and pointing table of a scores file, its baselines and maps checked to be scores."""
    report = read_scores_file(path, "run `captioner evaluate CHECKPOINT --grounding --out DIR` first")
    grounding = report.get("grounding")
    table = grounding.get("per_head") if isinstance(grounding, dict) else None
    if not isinstance(table, dict) or not table.get("words"):
        raise CaptionerError(f"{path}: no per-map grounding scores "
                             "(run `captioner evaluate CHECKPOINT --grounding` first)")
    where = f"{path}: grounding.per_head"
    score_fields(table.get("baselines"), f"{where}.baselines", BASELINES)
    maps = table.get("maps")
    if not isinstance(maps, dict):
        raise CaptionerError(f"{where}.maps: expected an object of map kinds")
    for name, scores in maps.items():
        score_fields(scores, f"{where}.maps.{name}", MAP_SCORES)
    return table


def number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def map_words(name: str, table: dict) -> str:
    """A map kind in words: "layer 0, head 1 (best)", "layer 0, mean of heads", "Grad-CAM"."""
    head, layer_mean = HEAD.fullmatch(name), LAYER_MEAN.fullmatch(name)
    if name == "gradcam":
        return "Grad-CAM"
    if name == "L0H0" and len(table["maps"]) <= 2:
        return "attention"
    if head:
        return f"layer {head[1]}, head {head[2]}" + (" (best)" if name == table.get("best_head") else "")
    if layer_mean:
        return f"layer {layer_mean[1]}, mean of heads"
    return "mean of all layers and heads" if name == "mean" else name


def rows(label: str, path: Path) -> list[str]:
    table = per_head_table(path)
    base = table["baselines"]
    return [f"| {label} | {map_words(name, table)} | {number(scores['grounding'])} | "
            f"{number(base['uniform_grounding'])} | {number(scores['pointing'])} | {number(base['random_point'])} | "
            f"{number(base['centre_point'])} |"
            for name, scores in table["maps"].items()]


def label_and_path(run: str) -> tuple[str, Path]:
    label, sep, path = run.partition("=")
    if not sep or not label or not path:
        raise CaptionerError(f"{run!r}: expected LABEL=SCORES_JSON, e.g. LSTM=runs/shapes_lstm/scores_test.json")
    return label, Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = AnyOrderParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="LABEL=SCORES_JSON")
    args = parser.parse_args(argv)
    try:
        table = [row for run in args.runs for row in rows(*label_and_path(run))]
    except CaptionerError as e:
        return refused(e)  # its one line, exit status 2
    print("| model | map | grounding | uniform | pointing hit rate | random point | image centre |")
    print("|---|---|---:|---:|---:|---:|---:|")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
