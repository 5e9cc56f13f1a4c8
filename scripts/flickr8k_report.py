"""What the models say on a test split, beside the humans: the leave-one-out table with a human
row, caption statistics, a gallery of test photographs and the images the best model does worst.
Each run folder holds `best.pt` and the results and scores `captioner evaluate RUN/best.pt --split
test --out RUN` writes. Needs Java (the official metrics) unless --no-human."""

from __future__ import annotations

import argparse
import math
import json
import random
import sys
from pathlib import Path
from typing import Any

from captioner.apps.arguments import AnyOrderParser
from captioner.apps.cli import refused
from captioner.core.errors import CaptionerError
from captioner.core.files import check_writable_folder, make_folder
from captioner.evaluation.results_files import read_scores_file, score_fields

KEYS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")
GALLERY_SIZE, WORST = 12, 10


def parse_run(text: str) -> tuple[str, Path]:
    name, sep, folder = text.partition("=")
    if not sep or not name or not folder:
        raise argparse.ArgumentTypeError(f"expected NAME=RUN_FOLDER, got {text!r}")
    return name, Path(folder)


def remedy(run: Path) -> str:
    return f"run `captioner evaluate {run}/best.pt --split test --out {run}`"


def read_scores(path: Path) -> dict[str, Any]:
    """A run's scores file, its "overall" scores numbers (or null)."""
    document = read_scores_file(path, remedy(path.parent))
    overall = document.get("overall")
    score_fields(overall, f"{path}: overall", [k for k in KEYS if isinstance(overall, dict) and k in overall])
    return document


def per_image_cider(path: Path, document: dict[str, Any], references: dict[int, list[str]]) -> dict[int, float]:
    """image id -> CIDEr-D of a scores file's per-image rows, each an image of the split."""
    rows = document.get("per_image")
    try:
        per_image = {row["image_id"]: float(row["CIDEr"]) for row in rows}
    except (TypeError, KeyError, ValueError, OverflowError):  # OverflowError: an integer past a float's range
        raise CaptionerError(f"{path}: 'per_image' is not a list of rows with an image_id and a numeric CIDEr "
                             "(written by captioner evaluate)") from None
    if not all(map(math.isfinite, per_image.values())):  # a NaN would sort anywhere among the worst images
        raise CaptionerError(f"{path}: 'per_image' holds a CIDEr that is not a finite number (NaN or infinite)")
    unknown = [image_id for image_id in per_image if image_id not in references]
    if unknown:
        raise CaptionerError(f"{path}: 'per_image' holds image {unknown[0]!r}, which is not in the split")
    if not per_image:
        raise CaptionerError(f"{path}: 'per_image' holds no image")
    return per_image


def checked_arguments(args: argparse.Namespace) -> dict[str, Path]:
    """The runs by name, once the arguments are seen to make sense: said before anything is read or computed."""
    names = [name for name, _ in args.run]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise CaptionerError(f"--run {twice[0]}: named twice; give each run a name of its own")
    runs = dict(args.run)
    if args.best not in runs:
        raise CaptionerError(f"--best {args.best!r} is not one of the runs ({', '.join(runs)})")
    if not args.out:
        raise CaptionerError("--out: give the folder the report is written into")
    check_writable_folder(args.out)
    if args.gallery_images and not Path(args.gallery_images).is_dir():
        raise CaptionerError(f"--gallery-images {args.gallery_images}: not a folder of photographs")
    return runs


def cells(scores: dict[str, float]) -> list[str]:
    """BLEU, METEOR and ROUGE-L in percent as the papers print them, CIDEr-D as a fraction; '-' where a
    metric is missing (a --fast evaluation has no METEOR or ROUGE-L)."""
    return [("-" if scores.get(k) is None else f"{scores[k]:.3f}" if k == "CIDEr" else f"{100 * scores[k]:.1f}")
            for k in KEYS]


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


def report(args: argparse.Namespace, runs: dict[str, Path]) -> dict[str, Any]:
    from PIL import Image

    from captioner.data.datasets import load_split
    from captioner.data.image_files import load_image
    from captioner.evaluation.caption_stats import corpus_stats, leave_one_out, unmatched_words
    from captioner.evaluation.metrics import fast_scores, score_official_many
    from captioner.evaluation.results_files import load_results
    from captioner.models.checkpoint import checkpoint_config
    from captioner.viz.overlays import GalleryItem, gallery_sheet

    data = checkpoint_config(runs[args.best] / "best.pt").data
    records = load_split(data, args.split)
    references = {r.image_id: list(r.captions) for r in records}
    training = [c for r in load_split(data, "train", check_images=False) for c in r.captions]
    predictions, scores = {}, {}
    for name, folder in runs.items():
        results = folder / f"results_{args.split}.json"
        if not results.exists():
            raise CaptionerError(f"{results}: no results file ({remedy(folder)})")
        predictions[name] = load_results(results, references)
        scores[name] = read_scores(folder / f"scores_{args.split}.json")
        missing = len(references) - len(predictions[name])
        if missing:
            raise CaptionerError(f"{results}: {missing} of the {len(references)} {args.split} images "
                                 "have no caption")
    per_image = per_image_cider(runs[args.best] / f"scores_{args.split}.json", scores[args.best], references)
    gallery_root = Path(args.gallery_images) if args.gallery_images else None
    shown = [r for r in records if gallery_root is None or (gallery_root / r.path.name).is_file()]
    if not shown:
        raise CaptionerError(f"--gallery-images {gallery_root}: holds none of the {len(records)} {args.split} "
                             "photographs")

    out: dict[str, Any] = {"split": args.split, "images": len(references),
                           "runs": {n: str(f) for n, f in runs.items()}}
    out["scores"] = {name: scores[name]["overall"] for name in runs}
    md = [f"# {args.split}: {len(references)} images\n",
          "## Official metrics, each caption against all its references\n"]
    md.append(table(["model", *KEYS], [[name, *cells(s)] for name, s in out["scores"].items()]))

    if not args.no_human:
        scorer = (lambda jobs: [fast_scores(*job) for job in jobs]) if args.fast else (
            lambda jobs: [scores.overall for scores in score_official_many(jobs)])
        folds = leave_one_out(references, scorer, predictions)
        out["leave_one_out"] = {"folds": folds.folds, "human": folds.human, **folds.models}
        md += [(f"\n## Leave one out: each human caption, and each model, against the other {folds.folds - 1} "
                "references\n"),
               table(["captions", *KEYS],
                     [[name, *cells(s)] for name, s in {"human": folds.human, **folds.models}.items()])]

    fold_count = min(len(c) for c in references.values())
    human_folds = [corpus_stats([references[i][k] for i in references], training) for k in range(fold_count)]
    stats = {name: corpus_stats(list(predictions[name].values()), training) for name in runs}
    stats["human (mean of the single-reference sets)"] = {key: sum(f[key] for f in human_folds) / fold_count
                                                          for key in human_folds[0]}
    out["caption_stats"] = stats
    md += ["\n## What the captions say\n", table(
        ["captions", "vocabulary (words used)", "copied from training", "distinct captions", "mean length (words)"],
        [[name, f"{s['vocabulary']:.0f}", f"{100 * s['copied_share']:.1f}%", f"{100 * s['distinct_share']:.1f}%",
          f"{s['mean_length']:.2f}"]
         for name, s in stats.items()])]

    # Why BLEU-1 is what it is: the words that match no reference, the model's and the humans'.
    used, unmatched = unmatched_words(predictions[args.best], references)
    human_used, human_unmatched = unmatched_words({i: refs[0] for i, refs in references.items()},
                                                  {i: refs[1:] for i, refs in references.items()})
    precision = {args.best: 1 - sum(unmatched.values()) / max(1, sum(used.values())),
                 "human (first caption against the other references)":
                     1 - sum(human_unmatched.values()) / max(1, sum(human_used.values()))}
    out["unigram_precision"] = precision
    out["unmatched_words"] = [{"word": w, "unmatched": n, "used": used[w]} for w, n in unmatched.most_common(25)]
    md += [f"\n## Words that match no reference ({args.best})\n",
           ", ".join(f"{name}: unigram precision {p:.3f}" for name, p in precision.items()) + "\n",
           table(["word", "unmatched", "used"],
                 [[w["word"], str(w["unmatched"]), str(w["used"])] for w in out["unmatched_words"]])]

    by_id = {r.image_id: r for r in records}
    chosen = sorted(random.Random(args.seed).sample(shown, min(GALLERY_SIZE, len(shown))), key=lambda r: r.path.name)

    def picture(record: Any) -> Image.Image:
        path = (gallery_root / record.path.name if gallery_root and (gallery_root / record.path.name).is_file()
                else record.path)
        return load_image(path)

    items = [GalleryItem(picture(r), r.path.name,
                         [*((n, predictions[n][r.image_id]) for n in runs), ("human", r.captions[0])])
             for r in chosen]
    out["gallery"] = [r.path.name for r in chosen]
    make_folder(args.out, f"--out {args.out}")
    gallery_sheet(items).save(Path(args.out) / "gallery.jpg", quality=88)

    worst = sorted(per_image, key=lambda i: (per_image[i], i))[:WORST]
    out["worst"] = [{"image": by_id[i].path.name, "CIDEr": per_image[i],
                     "caption": predictions[args.best][i], "references": references[i]} for i in worst]
    md += [f"\n## The {WORST} test images with the lowest CIDEr-D ({args.best})\n"]
    md += [f"{n}. `{w['image']}` CIDEr-D {w['CIDEr']:.3f}: \"{w['caption']}\"; "
           f"humans: \"{w['references'][0]}\" / \"{w['references'][1]}\""
           for n, w in enumerate(out["worst"], 1)]
    worst_items = [GalleryItem(picture(by_id[i]), f"CIDEr-D {per_image[i]:.3f}  {by_id[i].path.name}",
                               [(args.best, predictions[args.best][i]), ("human", references[i][0]),
                                ("human", references[i][1])])
                   for i in worst]
    gallery_sheet(worst_items, columns=5).save(Path(args.out) / "worst.jpg", quality=88)
    (Path(args.out) / "report.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    (Path(args.out) / "report.json").write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print("\n".join(md))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = AnyOrderParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=parse_run, action="append", required=True, metavar="NAME=RUN",
                        help="a model's run folder (repeat)")
    parser.add_argument("--best", required=True, help="the NAME whose worst images are listed")
    parser.add_argument("--out", required=True, help="folder for report.md, report.json, gallery.jpg, worst.jpg")
    parser.add_argument("--split", default="test", choices=("val", "test"))
    parser.add_argument("--gallery-images",
                        help="a folder of the same photographs at full resolution, shown in the figures where present")
    parser.add_argument("--seed", type=int, default=0, help="which photographs the gallery shows")
    parser.add_argument("--no-human", action="store_true", help="leave out the leave-one-out table (it needs Java)")
    parser.add_argument("--fast", action="store_true",
                        help="leave-one-out with the in-process BLEU and CIDEr-D (no Java, no METEOR)")
    args = parser.parse_args(argv)
    try:
        report(args, checked_arguments(args))  # the arguments checked before the report's imports
    except CaptionerError as e:
        return refused(e)  # its one line, exit status 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
