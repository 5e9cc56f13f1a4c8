"""`captioner demo [CHECKPOINT ...]`: serve the Gradio page."""

from __future__ import annotations

import argparse
from pathlib import Path

from captioner.apps.arguments import expand_images
from captioner.core.errors import CaptionerError


def add_parser(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser("demo", help="serve the Gradio page: captions with per-word attention heatmaps")
    demo.add_argument("checkpoints", nargs="*", help="models to offer (default: the quickstart's, trained first if missing)")
    demo.add_argument("--examples", nargs="+", help="example images or folders (default: the first model's test images)")
    demo.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to serve other machines")
    demo.add_argument("--port", type=int, default=7860)
    demo.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        from captioner.apps.demo.server import serve
    except ModuleNotFoundError as e:
        if e.name != "gradio":
            raise
        raise CaptionerError("demo: Gradio is not installed (pip install -e '.[demo]')") from None

    examples = expand_images(args.examples) if args.examples else None
    serve([Path(c) for c in args.checkpoints], examples, host=args.host, port=args.port)
    return 0
