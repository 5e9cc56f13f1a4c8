"""One photograph on the CPU with the model packaged with captioner: what a user waits for. Each
round is a fresh interpreter: the import, the load, the first caption, a second, its word maps
figure, and the interpreter's exit; the median of each, in seconds. The exit is timed both ways, in
alternate rounds: with the objects frozen, as the `captioner` command exits (apps/cli.command_line),
and collected once more, as a plain script's interpreter does."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from captioner.apps.arguments import positive_int
from captioner.core.config_sections import thread_count

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.timing import argument_parser, print_environment, run_main, summarise  # noqa: E402

ROUND = """
import gc, json, sys, time
t0 = time.perf_counter()
import torch
from captioner.core.process_settings import set_threads
set_threads({threads})
from captioner.models.checkpoint import default_model
t1 = time.perf_counter()
model = default_model("cpu")
t2 = time.perf_counter()
first = model.caption(sys.argv[1])
t3 = time.perf_counter()
again = model.caption(sys.argv[1])
t4 = time.perf_counter()
from PIL import Image
from captioner.viz.overlays import save_attention_figure
save_attention_figure(sys.argv[2], Image.open(sys.argv[1]).convert("RGB"), again)
t5 = time.perf_counter()
print(json.dumps({{"import": t1 - t0, "load": t2 - t1, "first caption": t3 - t2, "caption": t4 - t3,
                  "word maps figure": t5 - t4, "text": first.text, "model": model.origin.name,
                  "threads": torch.get_num_threads(), "ended": time.time()}}), flush=True)
if {freeze}:
    gc.freeze()
"""


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("packaged_model", __doc__)
    parser.add_argument("photo")
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--threads", type=thread_count, default=None, help="torch threads (default: the free cores)")
    args = parser.parse_args(argv)
    from captioner.data.image_files import load_image

    load_image(args.photo)  # a missing file or one that is not a photo: one line here, before the rounds
    print_environment(args)
    rounds = []
    with tempfile.TemporaryDirectory() as folder:
        for k in range(2 * args.rounds):
            freeze = k % 2 == 0
            done = subprocess.run([sys.executable, "-c", ROUND.format(threads=args.threads, freeze=freeze),
                                   args.photo, f"{folder}/maps.png"], capture_output=True, text=True)
            ended = time.time()
            if done.returncode != 0:
                raise SystemExit(f"a round: exit {done.returncode}: {done.stderr.strip()[-500:]}")
            rounds.append(json.loads(done.stdout.strip().splitlines()[-1]))
            rounds[-1]["exit" if freeze else "exit, collected"] = ended - rounds[-1]["ended"]
    first = rounds[0]
    print(f"{first['model']} on {args.photo}, {first['threads']} thread(s), {2 * args.rounds} fresh interpreters: "
          f"{first['text']!r}")
    print("| step | seconds |\n|---|---:|")
    for step in ("import", "load", "first caption", "caption", "word maps figure", "exit", "exit, collected"):
        print(f"| {step} | {summarise([r[step] for r in rounds if step in r])} |")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
