"""`captioner config show|keys`: the resolved config a run would use, and every key's meaning."""

from __future__ import annotations

import argparse

from captioner.core.errors import ConfigError


def add_parser(commands: argparse._SubParsersAction) -> None:
    config = commands.add_parser("config", help="print a resolved config, or every config key and what it means")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    show = config_commands.add_parser("show",
                                      help="the config after defaults, the YAML file and the overrides, as YAML")
    show.add_argument("config", nargs="?",
                      help="a YAML file under configs/ or your own (default: the built-in defaults)")
    show.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.epochs=5")
    show.set_defaults(func=run_show)
    keys = config_commands.add_parser("keys", help="every key: type, default, allowed values, meaning")
    keys.add_argument("prefix", nargs="?", default="",
                      help="only keys starting with this, e.g. train. or decode.beam (default: all)")
    keys.set_defaults(func=run_keys)


def run_show(args: argparse.Namespace) -> int:
    from captioner.core.config import load_config
    from captioner.core.config_keys import show_config

    path, overrides = args.config, list(args.overrides)
    if path is not None and "=" in path:  # `config show train.epochs=3`: overrides of the defaults
        path, overrides = None, [path, *overrides]
    print(show_config(load_config(path, overrides)), end="")
    return 0


def run_keys(args: argparse.Namespace) -> int:
    from captioner.core.config_keys import config_keys, format_keys

    keys = [key for key in config_keys() if key.name.startswith(args.prefix)]
    if not keys:
        raise ConfigError(f"no config key starts with {args.prefix!r} (sections: data, model, train, scst, decode)")
    print(format_keys(keys))
    return 0
