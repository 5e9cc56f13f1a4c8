"""`captioner push CHECKPOINT REPO_ID`: export (unless it already is an export) and upload to the Hugging Face Hub."""

from __future__ import annotations

import argparse


def add_parser(commands: argparse._SubParsersAction) -> None:
    push = commands.add_parser(
        "push", needs="a model and a Hub repo id, e.g. captioner push runs/shapes_lstm you/shapes-captioner",
        help="upload a model to the Hugging Face Hub (exported first if it is a checkpoint)")
    push.add_argument("checkpoint", help="a checkpoint (.pt), a run folder or an exported folder")
    push.add_argument("repo_id", help="owner/name on the Hub (created if missing)")
    push.add_argument("--private", action="store_true", help="create the repo private")
    push.add_argument("--image", help="the image the card's attention figure captions (default: the first test image)")
    push.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from captioner.apps.export import push_model
    from captioner.core.errors import ExportError
    from captioner.models.model_paths import looks_like_repo_id

    if not looks_like_repo_id(args.repo_id):
        raise ExportError(f"push: {args.repo_id!r} is not a Hub repo id (owner/name)")
    print(push_model(args.checkpoint, args.repo_id, private=args.private, image=args.image))
    return 0
