"""Print pip constraints that hold each floored package of pyproject.toml at its floor's release
series (`gradio>=6.31` -> `gradio==6.31.*`), so the test install (scripts/setup.sh, EXTRAS=test)
runs the suite on the versions the floors promise (tests/test_version_floors.py checks them)."""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

FLOORED = ("torch", "torchvision", "gradio", "onnxruntime", "onnx", "onnxscript")


def floors(pyproject: Path) -> dict[str, str]:
    """package -> its `>=` floor as written, over the core and extra requirements."""
    project = tomllib.loads(pyproject.read_text())["project"]
    found = {}
    for requirement in [*project["dependencies"], *sum(project["optional-dependencies"].values(), [])]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)(?:\s*,.*)?", requirement.strip())
        if match:
            found[match.group(1).lower()] = match.group(2)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pyproject", type=Path, default=Path(__file__).resolve().parents[1] / "pyproject.toml")
    found = floors(parser.parse_args().pyproject)
    missing = [package for package in FLOORED if package not in found]
    if missing:
        sys.exit(f"pyproject.toml: no >= floor for {', '.join(missing)}")
    for package in FLOORED:
        print(f"{package}=={found[package]}.*")


if __name__ == "__main__":
    main()
