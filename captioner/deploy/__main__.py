"""`python -m captioner.deploy DIR IMAGE...`: `IMAGE<TAB>caption` per image from an exported ONNX folder,
without torch, under the contract of `captioner`'s commands (docs/deploy.md): a mistake is one line on
stderr and exit status 2; images that do not load beside others that do are named, exit status 1."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from captioner.core.config_sections import MAX_THREADS, thread_count  # torch-free, as the runtime is
from captioner.core.decode_schema import OPTIONS as DECODE_OPTIONS
from captioner.core.errors import CaptionerError


class OneLineParser(argparse.ArgumentParser):
    """argparse's refusal as one line and exit status 2, without the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message}\n")


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m captioner.deploy", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the folder `captioner export CKPT DIR --onnx` wrote (DIR or DIR/onnx)")
    parser.add_argument("images", nargs="+")
    parser.add_argument("--beam", type=DECODE_OPTIONS["beam_size"].argument_type(), default=None, metavar="K",
                        help=f"beam size, {DECODE_OPTIONS['beam_size'].describe()} (1: greedy; default: the export's)")
    parser.add_argument("--max-length", type=DECODE_OPTIONS["max_length"].argument_type(), default=None, metavar="N",
                        help=(f"most words per caption, {DECODE_OPTIONS['max_length'].describe()} (default: the "
                              "export's)"))
    parser.add_argument("--threads", type=thread_count, default=None,
                        help=f"onnxruntime threads per operator, 1 to {MAX_THREADS} (default: the cores available)")
    return parser.parse_args(argv)


def no_export_named(folder: str) -> str | None:
    """The one line for an image given where the exported folder goes: the runtime ships no model
    (it stays small and torch-free), so it says how to export the one packaged with captioner."""
    if not Path(folder).is_file():
        return None
    packaged = Path(__file__).resolve().parents[1] / "pretrained"  # where `pip install captioner` puts its model
    folders = packaged.iterdir() if packaged.is_dir() else ()
    source = min((p.name for p in folders if p.is_dir() and not p.name.startswith(("_", "."))), default="RUN")
    return (f"{folder}: a file, where the exported ONNX folder goes first; the runtime ships no model: export one with "
            f"`captioner export {source} DIR --onnx` (PyTorch's captioner), then `captioner-onnx DIR IMAGE...`")


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    problem = no_export_named(args.folder)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from captioner.deploy.runtime import OnnxCaptioner

    try:
        model = OnnxCaptioner.from_folder(args.folder, threads=args.threads)
        results = model.caption(args.images, errors="return", beam_size=args.beam, max_length=args.max_length)
    except CaptionerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    failures = [result for result in results if isinstance(result, CaptionerError)]
    if failures and len(failures) == len(results):  # nothing captioned: the user's mistake, one line
        many = f"none of the {len(results)} images could be read (e.g. {failures[0]})"
        print(f"error: {failures[0] if len(results) == 1 else many}", file=sys.stderr)
        return 2
    for image, result in zip(args.images, results):
        if isinstance(result, CaptionerError):
            print(f"error: {result}", file=sys.stderr)
        else:
            print(f"{image}\t{result.text}")
    if failures:
        print(f"{len(failures)} of {len(results)} images failed", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
