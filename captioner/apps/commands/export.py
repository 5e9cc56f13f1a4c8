"""`captioner export CHECKPOINT DIR`: the model in the Hugging Face Hub layout (`--onnx`: also ONNX; `--web`: a page);
`captioner push CHECKPOINT REPO_ID`: export (unless it already is an export) and upload to the Hugging Face Hub."""

from __future__ import annotations

import argparse

from captioner.apps.arguments import decode_value, takes


def add_parser(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser(
        "export",
        needs="a checkpoint and the folder to write, e.g. captioner export runs/shapes_lstm runs/shapes_lstm_export",
        help="write a checkpoint as a loadable, shareable folder (Hub layout; --onnx; --web)")
    export.add_argument("checkpoint", help="a checkpoint (.pt) or a run folder (its best.pt)")
    export.add_argument("folder", help="the folder to write (new or empty, or an earlier export)")
    export.add_argument("--image",
                        help="the image the card's attention figure captions (default: the first test image)")
    export.add_argument("--onnx", action="store_true",
                        help="also write the encoder and the decoder step as ONNX (onnx/)")
    export.add_argument("--web", action="store_true",
                        help="write a static web page that captions in the browser, no server (docs/deploy.md)")
    export.add_argument("--ort", metavar="PATH", default=None,
                        help="with --web: copy onnxruntime-web into the site from this installed npm package "
                             "(node_modules/onnxruntime-web; default: the page loads it from a CDN)")
    export.add_argument("--beam", type=decode_value("beam_size"), default=None,
                        help=f"the export's default beam width, {takes('beam_size')} (default: the checkpoint's)")
    export.add_argument("--length-penalty", type=decode_value("length_penalty"), default=None, metavar="ALPHA",
                        help=("the export's default length penalty, e.g. the one tuned on dev "
                              "(default: the checkpoint's)"))
    export.set_defaults(func=run)
    push = commands.add_parser(
        "push", needs="a model and a Hub repo id, e.g. captioner push runs/shapes_lstm you/shapes-captioner",
        help="upload a model to the Hugging Face Hub (exported first if it is a checkpoint)")
    push.add_argument("checkpoint", help="a checkpoint (.pt), a run folder or an exported folder")
    push.add_argument("repo_id", help="owner/name on the Hub (created if missing)")
    push.add_argument("--private", action="store_true", help="create the repo private")
    push.add_argument("--image", help="the image the card's attention figure captions (default: the first test image)")
    push.set_defaults(func=run_push)


def run(args: argparse.Namespace) -> int:
    from captioner.apps.export import export_model
    from captioner.core.errors import ExportError

    if args.ort and not args.web:
        raise ExportError("export: --ort applies only with --web")
    if args.web and (args.onnx or args.image):
        raise ExportError(f"export: --web writes a site of its own; {'--onnx' if args.onnx else '--image'} "
                          "belongs to another export")
    if args.onnx or args.web:
        import onnx  # noqa: F401 - the 'onnx' extra: a missing one is said before any file is written
    decode = {"beam_size": args.beam, "length_penalty": args.length_penalty}
    decode = {key: value for key, value in decode.items() if value is not None}
    for path in export_model(args.checkpoint, args.folder, image=args.image, onnx=args.onnx, decode=decode,
                             web=args.web, ort=args.ort):
        print(path)
    return 0


def run_push(args: argparse.Namespace) -> int:
    from captioner.apps.export import push_model
    from captioner.core.errors import ExportError
    from captioner.models.model_paths import looks_like_repo_id

    if not looks_like_repo_id(args.repo_id):
        raise ExportError(f"push: {args.repo_id!r} is not a Hub repo id (owner/name)")
    print(push_model(args.checkpoint, args.repo_id, private=args.private, image=args.image))
    return 0
