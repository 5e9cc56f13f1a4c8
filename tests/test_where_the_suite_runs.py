"""The suite passes wherever it runs: guards for each way it once depended on its place.

A checkout that `git clone` names `captioner`, under a folder with a space or letters beyond
ASCII, is an ordinary place for a user's clone; the helpers that tell the package's frames from
the tests' are run here from copies in such places.
"""

from __future__ import annotations

import ast
import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest

import captioner
from captioner.core.files import write_atomically

HERE = Path(__file__).resolve().parent


def copied_helper(folder: Path) -> ModuleType:
    """tests/package_frames.py copied into `folder`/captioner/tests/ and imported from there."""
    tests = folder / "captioner" / "tests"
    tests.mkdir(parents=True)
    shutil.copy(HERE / "package_frames.py", tests)
    spec = importlib.util.spec_from_file_location(f"copied_frames_{abs(hash(folder))}", tests / "package_frames.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("place", ["a b", "ä ö", "x" * 120])
def test_a_read_is_blamed_on_the_package_from_a_checkout_named_captioner(tmp_path: Path, place: str) -> None:
    """The copy's frames lie under .../captioner/, as every file of such a checkout does: the
    innermost frame of the imported package is still the one named (a word in the path blamed
    the helper itself)."""
    frames = copied_helper(tmp_path / place)
    blamed = write_atomically(tmp_path / "out", lambda tmp: (tmp.touch(), frames.package_caller())[1])
    assert blamed is not None and blamed.startswith("files.py:"), blamed


def test_the_package_reached_through_a_link_is_the_package(tmp_path: Path) -> None:
    """runtime/captioner is a link to the package: frames through it are the package's; a sibling
    folder whose name starts alike is not."""
    frames = copied_helper(tmp_path / "a b")
    link = tmp_path / "a b" / "runtime" / "captioner"
    link.parent.mkdir()
    link.symlink_to(Path(captioner.__file__).resolve().parent)
    assert frames.in_package(str(link / "core" / "files.py"))
    sibling = tmp_path / "a b" / "captioner-old" / "core.py"
    sibling.parent.mkdir()
    sibling.touch()
    assert not frames.in_package(str(sibling))
    assert not frames.in_package(str(tmp_path / "a b" / "captioner" / "tests" / "package_frames.py"))


def test_no_test_imports_the_tests_folder_as_a_package() -> None:
    """`from tests.helpers import ...` finds tests/ only through the folder pytest was started in
    (the repository's): started anywhere else, those modules failed to import and pytest collected
    58 tests fewer. The tests' own modules are imported by their names, as pytest puts tests/ on
    the path."""
    offenders = []
    for path in sorted(HERE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            offenders += [f"{path.name}:{node.lineno}" for name in names
                          if name == "tests" or name.startswith("tests.")]
    assert not offenders, offenders
