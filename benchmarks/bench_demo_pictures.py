"""What each caption's pictures cost the demo's server, in process: the gallery's word maps (`render_page`), the
downloadable figure (`write_figure`) and, for a transformer, the views its page draws after a caption
(`inside_views`: the head view and the per-head maps), CPU milliseconds a caption on one thread.

    python -m benchmarks demo_pictures [CHECKPOINT] [--photos 8] [--rounds 3]

The model (default: the packaged one) captions Flickr8k photos as the page does (512 px, beam 3, with its
self-attention); each part then draws every photo's pictures once a round, and the best round is kept.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from captioner.apps.arguments import positive_int

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.shared_data import FLICKR8K_PHOTOS  # noqa: E402
from benchmarks.timing import argument_parser, print_environment, run_main  # noqa: E402

PHOTOS = FLICKR8K_PHOTOS


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("demo_pictures", __doc__)
    parser.add_argument("checkpoint", type=Path, nargs="?", help="default: the model packaged with captioner")
    parser.add_argument("--photos", type=positive_int, default=8,
                        help="Flickr8k photos captioned, then drawn each round")
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds over the photos; the best is kept")
    args = parser.parse_args(argv)
    photos = sorted(PHOTOS.glob("*.jpg"))[: args.photos]
    if not photos:
        raise SystemExit(f"no photos in {PHOTOS}")
    from captioner.core.process_settings import set_threads

    set_threads(1)  # the demo's server takes one thread where the packaged model is concerned
    print_environment(args)
    from captioner.apps.demo.page import DISPLAY_SIDE, MEAN, Result, inside_views, render_page, write_figure
    from captioner.data.image_files import load_image
    from captioner.models.checkpoint import default_model, load_captioner

    model = load_captioner(args.checkpoint, "cpu") if args.checkpoint else default_model("cpu")
    results = []
    for photo in photos:
        image = load_image(photo)
        image.thumbnail((DISPLAY_SIDE, DISPLAY_SIDE))
        caption = model.caption(image, beam_size=3, self_attention=model.decoder.has_self_attention)
        results.append(Result(caption, image, "bench", 3, 0.0, []))
    with tempfile.TemporaryDirectory() as folder:
        parts = {
            "word maps (the gallery)": lambda r: render_page(r, None, MEAN),
            "downloadable figure": lambda r: write_figure(r.image, r.caption, None, MEAN, Path(folder)),
        }
        if model.decoder.has_self_attention:
            parts["transformer views (head view, per-head maps)"] = lambda r: inside_views(
                r.image, r.caption, None, MEAN, None)
        print(f"\n{model.origin.name}: {len(results)} photos, {args.rounds} rounds, the best kept, one thread")
        print("| pictures | CPU ms a caption |\n|---|---:|")
        for name, draw in parts.items():
            draw(results[0])  # warm: fonts, colour tables, the head view's rendered words
            rounds = []
            for _ in range(args.rounds):
                start = time.process_time()
                for result in results:
                    draw(result)
                rounds.append((time.process_time() - start) / len(results))
            print(f"| {name} | {min(rounds) * 1e3:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
