"""One photograph on the CPU with the model packaged with captioner: what a user waits for. Each
round is a fresh interpreter: the import, the load, the first caption, a second, and its word maps
figure; the median of each, in seconds."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from captioner.apps.arguments import positive_int
from captioner.core.config_sections import thread_count

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.timing import argument_parser, print_environment, run_main, summarise  # noqa: E402

ROUND = """
import json, sys, time
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
                  "threads": torch.get_num_threads()}}))
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
        for _ in range(args.rounds):
            done = subprocess.run([sys.executable, "-c", ROUND.format(threads=args.threads), args.photo,
                                   f"{folder}/maps.png"], capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"a round: exit {done.returncode}: {done.stderr.strip()[-500:]}")
            rounds.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first = rounds[0]
    print(f"{first['model']} on {args.photo}, {first['threads']} thread(s), {args.rounds} fresh interpreters: "
          f"{first['text']!r}")
    print("| step | seconds |\n|---|---:|")
    for step in ("import", "load", "first caption", "caption", "word maps figure"):
        print(f"| {step} | {summarise([r[step] for r in rounds])} |")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
