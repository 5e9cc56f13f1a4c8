"""The `captioner` command line: the parser, logging and error handling (commands: `captioner.apps.commands`).
User mistakes (`CaptionerError`) print one line and exit 2; anything else is a bug and keeps its traceback."""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator

import captioner
from captioner.apps.arguments import AnyOrderParser
from captioner.apps.commands import caption, config, data, demo, evaluate, export, features, train
from captioner.core.errors import CaptionerError, first_line, missing_extra

log = logging.getLogger("captioner")


def setup_logging(verbosity: int = 0) -> None:
    """INFO: what the user acts on (progress, results, files, the next command); `-v` DEBUG; `-q` warnings. Under
    torchrun the run's info and warnings come from rank 0 alone (`RankZeroSays`)."""
    verbose = verbosity > 0
    root = logging.getLogger()
    before = list(root.handlers)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING if verbosity < 0 else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s" if verbose else "%(message)s",
        datefmt="%H:%M:%S",
    )
    if other_rank():
        for handler in root.handlers:
            if handler not in before:  # this command's own handler: an embedding program's are left alone
                handler.addFilter(RankZeroSays(verbose))
    for noisy in ("matplotlib", "PIL", "urllib3", "httpx", "httpcore", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def other_rank() -> bool:
    """Whether torchrun started this process as a rank other than 0 (RANK and WORLD_SIZE read as given, without
    torch: a malformed one is refused in one line once the run joins its group)."""
    rank, world = os.environ.get("RANK", "").strip(), os.environ.get("WORLD_SIZE", "").strip()
    return world.isdigit() and int(world) > 1 and rank not in ("", "0")


class RankZeroSays(logging.Filter):
    """A rank other than 0 says its errors, the records each rank says of its own share (`EVERY_RANK`), and at -v
    its debug lines; the info and warnings every rank would say alike (a config's, a resume's) are rank 0's alone,
    or the user reads each once per rank."""

    def __init__(self, verbose: bool) -> None:
        super().__init__()
        self.verbose = verbose

    def filter(self, record: logging.LogRecord) -> bool:
        return (record.levelno >= logging.ERROR or getattr(record, "every_rank", False)
                or (self.verbose and record.levelno < logging.INFO))


def add_verbosity_options(parser: argparse.ArgumentParser, default: object) -> None:
    """-v and -q on every parser, so they go before or after the command (but `data shapes --quiet`'s own)."""
    taken = set(parser._option_string_actions)
    if not taken & {"-v", "--verbose"}:
        parser.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1, default=default,
                            help=("also the diagnostics: speed choices, timings, tokenizer jobs, METEOR's tables, "
                                  "other BLEUs"))
    if not taken & {"-q", "--quiet"}:
        parser.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1, default=default,
                            help="warnings and errors only, beside the results")
    commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    # an alias names a parser twice
    for command in dict.fromkeys(p for action in commands for p in action.choices.values()):
        add_verbosity_options(command, argparse.SUPPRESS)  # the top level's default stands unless given here


def build_parser() -> argparse.ArgumentParser:
    parser = AnyOrderParser(prog="captioner", description="Image captioning with spatial attention.")
    parser.add_argument("--version", action="version", version=f"captioner {captioner.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in (data, train, features, caption, evaluate, export, demo, config):  # export: also push
        command.add_parser(commands)
    add_verbosity_options(parser, 0)
    return parser


def user_error(error: CaptionerError | ModuleNotFoundError) -> str | None:
    """The one line of a user's mistake: a CaptionerError, or the extra a missing package comes with; None: a bug."""
    return str(error) if isinstance(error, CaptionerError) else missing_extra(error)


def refused(error: CaptionerError | ModuleNotFoundError, prefix: str = "") -> int:
    """A user's mistake printed as its one line (after `prefix`, a rank's), exit 2; a bug raised again with its
    traceback."""
    message = user_error(error)
    if message is None:
        raise error
    print(f"error: {prefix}{message}", file=sys.stderr)
    return 2


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Ctrl-C held back while the block runs, delivered as it ends: an interrupt inside an import that a library's
    bare `except:` swallows would leave a module half made (numpy without `subtract`) and the command running."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def main(argv: list[str] | None = None) -> int:
    """The `captioner` command; Ctrl-C at any point is "interrupted" and exit status 130, no traceback."""
    try:
        return run_command(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def command_line(argv: list[str] | None = None) -> int:
    """The installed `captioner` and `python -m captioner`: `main`, then every object frozen for the exit. The
    interpreter's exit would collect torch's objects once more, a sixth of a one-image caption's time (`python -m
    benchmarks packaged_model`); in-process callers of `main` (tests, notebooks) keep their collector."""
    try:
        return main(argv)
    finally:
        gc.freeze()


def run_command(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbosity)
    if getattr(args, "runtime", None) == "onnx":  # the ONNX runtime: no torch is loaded, none need be installed
        try:
            return args.func(args)
        except (CaptionerError, ModuleNotFoundError) as e:
            return refused(e)
    try:
        with interrupts_held():
            from captioner.training import distributed  # the first import of torch (and numpy): about a second
    except ModuleNotFoundError as e:  # a Python without captioner's packages: a checkout's environment not active
        return refused(e)

    try:
        from captioner.core.allocator import keep_large_blocks, user_tuned
        from captioner.core.process_settings import set_threads

        user_tuned()  # a wrong CAPTIONER_MALLOC is refused, whatever the command
        if args.command != "demo":  # the demo's small batches, in worker threads, gain nothing (benchmarks demo_load)
            keep_large_blocks()  # a step's freed activations reused by the next, not mapped and zero-filled anew
        set_threads()  # $CAPTIONER_THREADS or the default, before any torch work
        return args.func(args)
    except (CaptionerError, ModuleNotFoundError) as e:  # ModuleNotFoundError: a package of an extra left out
        # under torchrun a refusal every rank raised alike is printed by rank 0 alone
        status = refused(e, distributed.rank_prefix()) if distributed.says_refusal(e) else 2
        if isinstance(e, CaptionerError) and distributed.launched():  # one of several ranks: torchrun stops the rest
            distributed.leave_after_refusal(e)
        return status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `captioner ... | head` stopped reading: not an error of ours, no traceback
        # Python's own flush at exit must not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for a command SIGPIPE ended
    except Exception as e:
        if distributed.launched():
            if distributed.peer_failed(e):  # the rank that failed has printed why
                print(f"error: {distributed.rank_prefix()}stopped because another rank failed ({first_line(e)})",
                      file=sys.stderr)
            else:  # a bug on this rank: its traceback, then every rank stops
                print(f"error: {distributed.rank_prefix()}unexpected failure:", file=sys.stderr)
                traceback.print_exc()
            distributed.abort(1)
        raise


if __name__ == "__main__":
    sys.exit(command_line())
