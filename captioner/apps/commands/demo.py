"""`captioner demo [CHECKPOINT ...]`: serve the Gradio page."""

from __future__ import annotations

import argparse
from pathlib import Path

from captioner.apps.arguments import expand_images, port_number, positive_int
from captioner.core.errors import CaptionerError, ImageLoadError


def add_parser(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser("demo", help="serve the Gradio page: captions with per-word attention heatmaps")
    demo.add_argument("checkpoints", nargs="*",
                      help="models to offer (default: the export at runs/default_model, else the model packaged "
                           "with captioner, else the quickstart's trained shapes model; never trained here)")
    demo.add_argument("--examples", nargs="+",
                      help="example images or folders (default: the first model's test images)")
    demo.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to serve other machines")
    demo.add_argument("--port", type=port_number, default=7860, help="the port the page is served on")
    demo.add_argument("--max-batch", type=positive_int, default=8, help="captions decoded together at most (default 8)")
    demo.add_argument("--queue-size", type=positive_int, default=32,
                      help="requests that may wait; more are told the app is busy (default 32)")
    demo.add_argument("--cache-max-age", type=positive_int, default=3600, metavar="SECONDS",
                      help="temporary files (uploads, heatmaps, figures) older than this are deleted (default 3600)")
    demo.add_argument("--cache-every", type=positive_int, default=600, metavar="SECONDS",
                      help="how often old temporary files are looked for (default 600)")
    demo.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        from captioner.apps.demo.server import serve
    except ModuleNotFoundError as e:
        if e.name != "gradio":
            raise
        raise CaptionerError("demo: Gradio is not installed (pip install -e '.[demo]')") from None

    from captioner.apps.demo.ui import Cleanup
    from captioner.models.model_paths import checkpoint_file

    for checkpoint in args.checkpoints:  # a model or an example that is not there is said before any model loads
        checkpoint_file(checkpoint)
    examples = example_images(args.examples) if args.examples else None
    cleanup = Cleanup(every_s=args.cache_every, max_age_s=args.cache_max_age)
    serve([Path(c) for c in args.checkpoints], examples, args.host, args.port, args.max_batch, args.queue_size, cleanup)
    return 0


def example_images(inputs: list[str]) -> list[Path]:
    """--examples as image files, each there, before the page is served."""
    paths = expand_images(inputs)
    if not paths:
        raise CaptionerError(f"demo --examples: no images in {', '.join(inputs)}")
    missing = [path for path in paths if not path.is_file()]
    if missing:
        raise ImageLoadError(f"demo --examples: {missing[0]}: no such file")
    return paths
