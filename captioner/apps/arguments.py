"""Arguments and inputs several commands share: decoding options, image lists, whole numbers."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from captioner.core.decode_schema import OPTIONS as DECODE_OPTIONS
from captioner.core.errors import CaptionerError

if TYPE_CHECKING:  # loaded when used: `--help` needs no torch
    from captioner.models.captioner import Captioner
    from captioner.models.ensemble import Ensemble

log = logging.getLogger("captioner")

REQUIRED = "the following arguments are required: "  # argparse's words for a missing argument

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}

# The decoding flags caption and evaluate share: flag, core/decode_schema.py option, metavar, help ({takes}: what
# the option takes); a true/false option is a switch that only turns it on.
DECODE_FLAGS = (
    ("--beam", "beam_size", None, "beam width, {takes} (1 = greedy; default from the config)"),
    ("--max-length", "max_length", None, "words per caption, {takes} (default from the config)"),
    ("--block-trigrams", "block_trigrams", None, "never repeat a word trigram within a caption"),
    ("--diverse-groups", "diverse_groups", "G",
     "diverse beam search with G groups of beam/G beams, {takes} (default from the config)"),
    ("--diversity-strength", "diversity_strength", "LAMBDA",
     "Hamming diversity penalty between groups, {takes} (default from the config)"),
    ("--min-length", "min_length", "N", "no caption shorter than N words, {takes} (default from the config)"),
    ("--length-penalty", "length_penalty", "ALPHA", "beam search ranks by log-probability / ((5 + length) / 6) "
     "** ALPHA; 0 favours short captions; {takes} (default from the config)"),
    ("--no-bad-endings", "suppress_bad_endings", None,
     'no caption ending on "a", "with", "of", ... (<eos> is not allowed right after them)'),
)


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends with the default wherever one is set and the text does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        quiet = action.default in (None, False, argparse.SUPPRESS) or action.default == []
        if quiet or "default" in help_text:
            return help_text
        return f"{help_text} (default: %(default)s)"


class AnyOrderParser(argparse.ArgumentParser):
    """A parser that takes options and positionals in any order (`train CONFIG --init X train.epochs=3`);
    one with subcommands keeps argparse's order (it cannot be parsed intermixed)."""

    _intermixing = False

    def __init__(self, *args: Any, needs: str | None = None, **kwargs: Any) -> None:
        """`needs`: what the command lacks without its positionals ("a config, e.g. captioner train X.yaml")."""
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)
        self.needs = needs

    def error(self, message: str) -> NoReturn:
        """argparse's refusal as every user error is: one line, exit status 2; a missing argument as what to give."""
        if message.startswith(REQUIRED):
            message = self.what_to_give(message.removeprefix(REQUIRED).split(", "))
        else:
            message += f" (see {self.prog} --help)"
        self.exit(2, f"error: {self.prog}: {message}\n")

    def what_to_give(self, missing: list[str]) -> str:
        """The missing arguments said as what to give: a command and its choices, or `needs`."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and action.dest in missing:
                return f"name a command: {', '.join(action.choices)}"
        if self.needs and any(action.dest in missing for action in self._get_positional_actions()):
            return f"give {self.needs}"
        return REQUIRED + ", ".join(missing)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        has_commands = any(a.nargs in (argparse.PARSER, argparse.REMAINDER) for a in self._get_positional_actions())
        if self._intermixing or has_commands:  # the intermixed parse's own two passes land here
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def expand_images(inputs: list[str]) -> list[Path]:
    """Files as given (a missing one is said when loaded), folders as their images, sorted; an empty folder warned."""
    found = [(Path(item), sorted(p for p in Path(item).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
              if Path(item).is_dir() else [Path(item)]) for item in inputs]
    paths = [path for _, images in found for path in images]
    for folder in [folder for folder, images in found if not images] if paths else []:
        log.warning("%s: no images in this folder", folder)
    return paths


def decode_options(args: argparse.Namespace) -> dict[str, Any]:
    """The decoding options given on the command line, by DecodeOptions field name: the rest keep the checkpoint's."""
    given = {name: getattr(args, flag[2:].replace("-", "_")) for flag, name, _, _ in DECODE_FLAGS}
    return {name: value for name, value in given.items() if value is not None and value is not False}


def whole_number(text: str, minimum: int) -> int:
    """`text` as an integer of at least `minimum`, or argparse's one-line error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
    return value


positive_int = functools.partial(whole_number, minimum=1)  # argparse type: an integer of at least 1
nonnegative_int = functools.partial(whole_number, minimum=0)  # argparse type: an integer of at least 0


def folder_to_write(text: str) -> Path:
    """argparse type: a folder a command writes into; an empty name is refused, not read as the current folder."""
    if not text.strip():  # Path("") is the current folder: the command's files would land beside the user's
        raise argparse.ArgumentTypeError("an empty name; give the folder to write into")
    return Path(text)


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 to 65535."""
    value = whole_number(text, 0)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {value}")
    return value


def decode_value(name: str) -> Callable[[str], Any]:
    """argparse type of a decoding option, judged by core/decode_schema.py."""
    return DECODE_OPTIONS[name].argument_type()


def takes(name: str) -> str:
    """What a decoding option's flag takes, for its help: "a whole number in [1, 100]"."""
    return DECODE_OPTIONS[name].describe()


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    """The decoding options caption and evaluate share, with --batch-size and --device."""
    for flag, name, metavar, help_text in DECODE_FLAGS:
        if DECODE_OPTIONS[name].kind is bool:
            parser.add_argument(flag, action="store_true", help=help_text)
        else:
            parser.add_argument(flag, type=decode_value(name), default=None, metavar=metavar,
                                help=help_text.format(takes=takes(name)))
    parser.add_argument("--batch-size", type=positive_int, default=None,
                        help="images per batch (default: the config's decode.batch_size)")
    add_device_argument(parser, default="auto")


def split_names(text: str, given_as: str, allowed: tuple[str, ...] = ("train", "val", "test")) -> list[str]:
    """The splits a comma-separated `--splits` names, each once; an unknown or empty name, or one named twice, is one
    line naming `given_as` (the command's option)."""
    splits = [s.strip() for s in text.split(",")]
    unknown = [s for s in splits if s not in allowed]
    if unknown:  # an empty name too (train,,val): a typo, not a split
        bad = ",".join(repr(s) if not s else s for s in unknown)
        raise CaptionerError(f"{given_as}: {bad} is not a split; use {','.join(allowed)}")
    twice = sorted({s for s in splits if splits.count(s) > 1})
    if twice:
        raise CaptionerError(f"{given_as} {text}: names {' and '.join(twice)} twice; name each split once")
    return splits


def add_device_argument(parser: argparse.ArgumentParser, default: str | None) -> None:
    """`--device`, the one way every command names the device (train and features: train.device; None: the config's)."""
    where = "" if default else " (default: the config's train.device)"
    parser.add_argument("--device", default=default,
                        help=f"auto (a CUDA GPU when there is one, else the CPU), cpu, mps, cuda or cuda:N{where}")


def device_overrides(args: argparse.Namespace) -> list[str]:
    """The config override that `--device` stands for in train and features (none without it)."""
    return [f"train.device={args.device}"] if args.device else []


def add_ensemble_arguments(parser: argparse.ArgumentParser) -> None:
    """--ensemble and --combine: several checkpoints decoded as one model."""
    parser.add_argument("--ensemble", nargs="+", action="extend", default=[], metavar="CKPT",
                        help="more checkpoints with the same vocabulary, decoded with CHECKPOINT as one model "
                             "(their probabilities averaged at every step); before or after the images")
    parser.add_argument("--combine", choices=("prob", "logprob"), default=None,
                        help="with --ensemble: average the members' probabilities (prob, the default) or their "
                             "log-probabilities, renormalised (logprob)")


def load_model(command: str, checkpoint: str | Path, args: argparse.Namespace) -> Captioner | Ensemble:
    """CHECKPOINT, or with --ensemble the ensemble of it and the other checkpoints, on --device."""
    from captioner.core.process_settings import resolve_device
    from captioner.models.checkpoint import load_captioner

    if args.combine and not args.ensemble:
        raise CaptionerError(f"{command}: --combine applies only with --ensemble")
    if not args.ensemble:
        return load_captioner(checkpoint, resolve_device(args.device, "--device"))
    from captioner.models.ensemble import Ensemble

    for member in args.ensemble:
        if Path(member).suffix.lower() in IMAGE_SUFFIXES:
            raise CaptionerError(f"{command}: --ensemble takes checkpoints, and {member} is an image "
                                 "(give --ensemble after the images)")
    device = resolve_device(args.device, "--device")
    return Ensemble.from_pretrained([checkpoint, *args.ensemble], device, args.combine or "prob")


@contextlib.contextmanager
def said_by_an_error(*logger_names: str, level: int = logging.WARNING) -> Iterator[None]:
    """Hold back what the named loggers log at `level` or above while the block runs: logged when it ends well,
    dropped when a CaptionerError stops it (its one line says it again)."""
    loggers = [logging.getLogger(name) for name in logger_names]
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        if record.levelno < level:
            return True
        held.append(record)
        return False

    for logger in loggers:
        logger.addFilter(hold)
    try:
        yield
    except CaptionerError:
        held.clear()
        raise
    finally:
        for logger in loggers:
            logger.removeFilter(hold)
        for record in held:  # a logger's filters see only the records it made: record.name names it
            logging.getLogger(record.name).handle(record)


def check_layer_and_head(command: str, layer: int, head: int | None, layers: int, heads: int) -> None:
    """--layer and --head within a model's `layers` x `heads` attention maps, else one line saying what it has."""
    if not -layers <= layer < layers:
        raise CaptionerError(f"{command} --layer {layer}: this model's maps have {layers} "
                             f"layer{'s' if layers > 1 else ''} (0 to {layers - 1}; -1 is the last)")
    if head is not None and not 0 <= head < heads:
        raise CaptionerError(f"{command} --head {head}: this model's maps have {heads} "
                             f"head{'s' if heads > 1 else ''} (0 to {heads - 1})")
