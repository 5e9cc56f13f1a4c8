"""Print pip constraints that hold each floored package of pyproject.toml at its floor's release
series (`gradio>=6.31` -> `gradio==6.31.*`), so the test install (scripts/setup.sh, EXTRAS=test)
runs the suite on the versions the floors promise (tests/test_version_floors.py checks them).
Standard library only: setup.sh runs it before captioner is installed."""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

FLOORED = ("torch", "torchvision", "gradio", "onnxruntime", "onnx", "onnxscript")


class FloorError(Exception):
    """A pyproject.toml the floors cannot be read from: one line naming it."""


def requirements(pyproject: Path) -> list[str]:
    """The core and extra requirements of a pyproject.toml; one FloorError where it cannot be read or lacks them."""
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError as e:
        raise FloorError(f"{pyproject}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise FloorError(f"{pyproject}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        project = tomllib.loads(text)["project"]
        found = [*project["dependencies"], *sum(project["optional-dependencies"].values(), [])]
    except tomllib.TOMLDecodeError as e:
        raise FloorError(f"{pyproject}: not valid TOML ({e})") from None
    except (KeyError, TypeError, AttributeError):
        found = None
    if found is None or not all(isinstance(requirement, str) for requirement in found):
        raise FloorError(f"{pyproject}: no [project] dependencies and optional-dependencies lists of requirements")
    return found


def floors(pyproject: Path) -> dict[str, str]:
    """package -> its `>=` floor as written, over the core and extra requirements."""
    found = {}
    for requirement in requirements(pyproject):
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)(?:\s*,.*)?", requirement.strip())
        if match:
            found[match.group(1).lower()] = match.group(2)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pyproject", type=Path, default=Path(__file__).resolve().parents[1] / "pyproject.toml")
    pyproject = parser.parse_args(argv).pyproject
    try:
        found = floors(pyproject)
    except FloorError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    missing = [package for package in FLOORED if package not in found]
    if missing:
        print(f"error: {pyproject}: no >= floor for {', '.join(missing)}", file=sys.stderr)
        return 2
    for package in FLOORED:
        print(f"{package}=={found[package]}.*")
    return 0


if __name__ == "__main__":
    sys.exit(main())
