"""The `captioner` command line: the parser, logging and error handling; each command lives in
`captioner.apps.commands` (its arguments and a thin `run` over the library).

User mistakes (`CaptionerError`) print one line and exit 2; anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

import captioner
from captioner.apps.arguments import AnyOrderParser
from captioner.apps.commands import caption, config, data, demo, evaluate, export, features, push, train
from captioner.core.errors import CaptionerError
from captioner.core.extras import missing_extra

log = logging.getLogger("captioner")

def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s" if verbose else "%(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("matplotlib", "PIL", "urllib3", "httpx", "httpcore", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def build_parser() -> argparse.ArgumentParser:
    parser = AnyOrderParser(prog="captioner", description="Image captioning with spatial attention.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"captioner {captioner.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in (data, train, features, caption, evaluate, export, push, demo, config):
        command.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    if getattr(args, "runtime", None) == "onnx":  # the ONNX runtime: no torch is loaded, none need be installed
        try:
            return args.func(args)
        except CaptionerError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except ModuleNotFoundError as e:
            if missing_extra(e) is None:
                raise
            print(f"error: {missing_extra(e)}", file=sys.stderr)
            return 2
    from captioner.training import distributed

    try:
        from captioner.core.runtime import set_threads

        set_threads()  # $CAPTIONER_THREADS or the default, before any torch work
        return args.func(args)
    except CaptionerError as e:
        print(f"error: {distributed.rank_prefix()}{e}", file=sys.stderr)
        if distributed.launched():  # one of several ranks: leave now, torchrun stops the others
            distributed.abort(2)
        return 2
    except ModuleNotFoundError as e:  # a package of an extra this install left out: say which
        if missing_extra(e) is None:
            raise
        print(f"error: {distributed.rank_prefix()}{missing_extra(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `captioner ... | head` stopped reading: not an error of ours, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit must not fail again
        return 141  # what a shell reports for a command SIGPIPE ended
    except Exception as e:
        if distributed.launched():
            if distributed.peer_failed(e):  # the rank that failed has printed why
                first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
                print(f"error: {distributed.rank_prefix()}stopped because another rank failed ({first})", file=sys.stderr)
            else:  # a bug on this rank: its traceback, then every rank stops
                print(f"error: {distributed.rank_prefix()}unexpected failure:", file=sys.stderr)
                traceback.print_exc()
            distributed.abort(1)
        raise


if __name__ == "__main__":
    sys.exit(main())
