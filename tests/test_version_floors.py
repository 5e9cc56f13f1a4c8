"""The lowest versions pyproject.toml admits are the ones the suite runs against: a floor below
what CI installs would promise support nobody has tried (a floor of torch 2.4 would admit a
torch without `torch.compiler.is_exporting`, which the products call and which came in 2.6)."""

from __future__ import annotations

import re
import runpy
from importlib.metadata import version
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parents[1] / "scripts"
FLOOR_SCRIPT = runpy.run_path(str(SCRIPTS / "floor_constraints.py"))  # the floors the test install holds, read one way
FLOORED = FLOOR_SCRIPT["FLOORED"]


def floors() -> dict[str, tuple[int, ...]]:
    """package -> the (major, minor[, patch]) of its `>=` floor, over the core and extra requirements."""
    found = {}
    for package, floor in FLOOR_SCRIPT["floors"](Path(__file__).parents[1] / "pyproject.toml").items():
        parts = tuple(int(part) for part in floor.split("."))
        found[package] = parts + (0,) * (2 - len(parts))  # ">=6" is 6.0: the minor counts
    return found


def installed(package: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version(package))[:3])


@pytest.mark.parametrize("package", FLOORED)
def test_the_floor_is_the_version_the_suite_runs(package: str) -> None:
    floor = floors().get(package)
    assert floor is not None, f"pyproject.toml: {package} has no >= floor"
    here = installed(package)
    assert here >= floor, f"{package} {version(package)} is below pyproject's floor {floor}"
    assert here[: len(floor)] == floor, (
        f"{package}: the suite runs {version(package)} but pyproject admits >= {'.'.join(map(str, floor))}: "
        "raise the floor to what is tested, or run the suite on the floor"
    )


def test_setup_pins_the_floor() -> None:
    setup = (Path(__file__).parents[1] / "scripts" / "setup.sh").read_text()
    for package in ("torch", "torchvision"):
        pinned = re.search(rf'"{package}==([0-9.]+)"', setup)
        assert pinned, f"scripts/setup.sh: {package} is not pinned"
        floor = floors()[package]
        assert tuple(int(p) for p in pinned.group(1).split("."))[: len(floor)] == floor


def test_the_test_install_is_constrained_to_every_floor() -> None:
    """scripts/setup.sh with EXTRAS=test installs under floor_constraints.py's pins: one per floored
    package, each its floor's release series."""
    import subprocess
    import sys

    printed = subprocess.run([sys.executable, str(SCRIPTS / "floor_constraints.py")], capture_output=True, text=True,
                             check=True).stdout
    pins = dict(line.split("==") for line in printed.split())
    assert list(pins) == list(FLOORED)
    for package, pin in pins.items():
        assert tuple(int(p) for p in pin.removesuffix(".*").split(".")) == floors()[package]
    setup = (SCRIPTS / "setup.sh").read_text()
    assert 'floor_constraints.py" > "$floors"' in setup and 'install "${constraints[@]}" -e' in setup
