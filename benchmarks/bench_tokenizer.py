"""How often the in-process tokenizer gives exactly the Java PTB tokenizer's tokens. It prints the
commonest disagreements and lets `--fast` metrics tokenise in process: it must stay near 100%."""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

from captioner.apps.arguments import nonnegative_int
from captioner.evaluation.metrics import ptb_tokenize
from captioner.evaluation.results_files import load_references
from captioner.text.tokenizer import tokenize

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.timing import argument_parser, print_environment, run_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("tokenizer", __doc__)
    parser.add_argument("annotations", type=Path, help="a COCO caption file (captions_*.json)")
    parser.add_argument("--show", type=nonnegative_int, default=10, help="disagreeing captions to print")
    args = parser.parse_args(argv)
    references = load_references(args.annotations)  # a missing or malformed file: one line (run_main)
    print_environment(args)
    captions = [caption for image in references.values() for caption in image]

    start = time.perf_counter()
    official = ptb_tokenize(captions)
    java_s = time.perf_counter() - start
    start = time.perf_counter()
    ours = [tokenize(c) for c in captions]
    python_s = time.perf_counter() - start

    differ = [i for i, (a, b) in enumerate(zip(official, ours)) if a != b]
    tokens = Counter()
    for i in differ:
        java, python = Counter(official[i]), Counter(ours[i])
        tokens.update(f"java {t!r}" for t in (java - python).elements())
        tokens.update(f"ours {t!r}" for t in (python - java).elements())
    same = len(captions) - len(differ)
    print(f"{args.annotations}: {len(captions)} captions")
    print(f"identical tokens: {same} of {len(captions)} = {100 * same / len(captions):.3f}%")
    print(f"Java PTB tokenizer {java_s:.1f} s (with JVM start); captioner.text.tokenizer {python_s:.1f} s")
    print("commonest disagreeing tokens:", ", ".join(f"{t} x{n}" for t, n in tokens.most_common(12)) or "none")
    for i in differ[: args.show]:
        print(f"  {captions[i]!r}\n    java: {' '.join(official[i])}\n    ours: {' '.join(ours[i])}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
