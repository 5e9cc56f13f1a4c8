"""Do two versions of the code decode the same captions? Record with one, compare with the other.

    (cd /tmp/old && python -m benchmarks same_captions record old.json RUN [RUN ...])  # a worktree
    python -m benchmarks same_captions record new.json RUN [RUN ...]
    python -m benchmarks same_captions compare old.json new.json  # exit 1 on any difference

A mistake (a run that is not a model, a file that is not a record of `record`, a folder where the record goes) is one
line and exit status 2, said before any captioning; a record is written whole or not at all."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from captioner.apps.arguments import AnyOrderParser, positive_int
from captioner.core.errors import CaptionerError
from captioner.core.files import write_atomically
from captioner.data.datasets import load_split
from captioner.data.image_files import load_image
from captioner.data.records import is_number, read_json
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import checkpoint_config

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.timing import run_main  # noqa: E402


def record(out: Path, runs: list[str], beams: list[int], batch_size: int) -> None:
    if out.is_dir():
        raise CaptionerError(f"{out}: a folder; give the file the record goes to")
    tests = {run: load_split(checkpoint_config(run).data, "test") for run in runs}  # each run a model, its data there
    report: dict[str, dict] = {}
    for run, records in tests.items():
        model = Captioner.from_pretrained(run, device="cpu").eval()
        started = time.perf_counter()
        with torch.no_grad():
            images = torch.stack([model.transform(load_image(r.path)) for r in records])  # (I, 3, S, S)
            encoded = [model.encode(images[i : i + batch_size]) for i in range(0, len(records), batch_size)]
        decoded: dict[str, dict] = {}
        for k in beams:
            hyps = [c for feats, grid in encoded
                    for c in model.decode(feats, grid, n_best=k, beam_size=k)]
            decoded[str(k)] = {
                str(r.image_id): [{"tokens": c.tokens, "score": c.score, "finished": c.finished} for c in captions]
                for r, captions in zip(records, hyps)
            }
        report[run] = {"images": len(records), "beams": decoded}
        print(f"{run}: {len(records)} test images, beams {beams}, {time.perf_counter() - started:.1f} s",
              file=sys.stderr)
    write_atomically(out, lambda tmp: tmp.write_text(json.dumps(report), encoding="utf-8"))


def read_report(path: Path) -> dict:
    """A file `record` wrote: run -> {"beams": {beam: {image id: [{"tokens": [...], "score": x}, ...]}}}; any other
    file is one line naming it and the first part that is not so."""
    report = read_json(path, "captions record")
    if not isinstance(report, dict) or not report:
        raise CaptionerError(f"{path}: not a record of `same_captions record` (an object of runs and their captions)")
    for run, entry in report.items():
        beams = entry.get("beams") if isinstance(entry, dict) else None
        if not isinstance(beams, dict) or not beams or not all(isinstance(images, dict) for images in beams.values()):
            raise CaptionerError(f'{path}: run {run!r}: no "beams" object of captions by beam size')
        for k, images in beams.items():
            for image, captions in images.items():
                if not (isinstance(captions, list) and captions and all(map(is_caption, captions))):
                    raise CaptionerError(f"{path}: run {run!r}, beam {k}, image {image}: not a list of captions "
                                         '(each with "tokens" and a "score")')
    return report


def is_caption(value: object) -> bool:
    """Whether `value` is a caption as `record` writes it: word ids and a score."""
    return isinstance(value, dict) and isinstance(value.get("tokens"), list) and is_number(value.get("score"))


def compare(old_file: Path, new_file: Path, tolerance: float) -> int:
    old, new = read_report(old_file), read_report(new_file)
    failed = False
    for run in old:
        if run not in new:
            print(f"{run}: missing from {new_file}")
            failed = True
            continue
        for k, images in old[run]["beams"].items():
            other = new[run]["beams"].get(k, {})
            differ = [i for i in images
                      if [c["tokens"] for c in images[i]] != [c["tokens"] for c in other.get(i, [])]]
            worst = max(
                (abs(a["score"] - b["score"]) for i in images if i not in differ for a, b in zip(images[i], other[i])),
                default=0.0,
            )
            hyps = sum(len(c) for c in images.values())
            print(f"{run} beam {k}: {len(images)} images, {hyps} hypotheses, {len(differ)} images differ, "
                  f"largest score change {worst:.2e}")
            for i in differ[:10]:
                print(f"  image {i}: {[c['tokens'] for c in images[i]]} -> {[c['tokens'] for c in other.get(i, [])]}")
            failed |= bool(differ) or worst > tolerance or not images
    return int(failed)


def main(argv: list[str] | None = None) -> int:
    parser = AnyOrderParser(prog="python -m benchmarks same_captions", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="caption every test image of each run, write word ids and scores")
    rec.add_argument("out", type=Path)
    rec.add_argument("runs", nargs="+", help="run folders or checkpoints")
    rec.add_argument("--beams", type=positive_int, nargs="+", default=[3, 5])
    rec.add_argument("--batch-size", type=positive_int, default=32)
    cmp = sub.add_parser("compare", help="exit 1 unless both files hold the same captions")
    cmp.add_argument("old", type=Path)
    cmp.add_argument("new", type=Path)
    cmp.add_argument("--score-tolerance", type=float, default=1e-5)
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.out, args.runs, args.beams, args.batch_size)
        return 0
    return compare(args.old, args.new, args.score_tolerance)


if __name__ == "__main__":
    sys.exit(run_main(main))
