"""Do two versions of the code decode the same captions? Record with one, compare with the other.

    (cd /tmp/old && python -m benchmarks same_captions record old.json RUN [RUN ...])  # a worktree
    python -m benchmarks same_captions record new.json RUN [RUN ...]
    python -m benchmarks same_captions compare old.json new.json  # exit 1 on any difference
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from captioner.data.datasets import load_split
from captioner.data.image_files import load_image
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import checkpoint_config


def record(out: Path, runs: list[str], beams: list[int], batch_size: int) -> None:
    report: dict[str, dict] = {}
    for run in runs:
        model = Captioner.from_pretrained(run, device="cpu").eval()
        records = load_split(checkpoint_config(run).data, "test")
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
    out.write_text(json.dumps(report))


def compare(old_file: Path, new_file: Path, tolerance: float) -> int:
    old, new = json.loads(old_file.read_text()), json.loads(new_file.read_text())
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
    parser = argparse.ArgumentParser(prog="python -m benchmarks same_captions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="caption every test image of each run, write word ids and scores")
    rec.add_argument("out", type=Path)
    rec.add_argument("runs", nargs="+", help="run folders or checkpoints")
    rec.add_argument("--beams", type=int, nargs="+", default=[3, 5])
    rec.add_argument("--batch-size", type=int, default=32)
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
    sys.exit(main())
