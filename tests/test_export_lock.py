"""Exports into one folder (`core.files.staged_folder`): a second one while the first still writes is refused in one
line and leaves no trace; what an export killed with SIGKILL left (a new set never swapped in, the earlier set it
had moved aside) is cleared by the next one, the earlier complete set moved back when the swap was cut short. The
kills are real: a child process SIGKILLs itself at a chosen rename of its swap."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import subprocess_env

from captioner.apps.cli import main
from captioner.core.errors import StorageError
from captioner.core.files import staged_folder

MARKER = "marker.json"
REPLACES = {MARKER, "weights.bin", "graphs"}
EARLIER = {MARKER: b'{"set": "earlier"}', "weights.bin": b"earlier weights", "graphs/a.onnx": b"earlier graph"}
NEW = {MARKER: b'{"set": "new"}', "weights.bin": b"new weights", "graphs/a.onnx": b"new graph"}
RENAMES = 2 * len(REPLACES)  # the earlier set's 3 entries moved aside, then the new set's 3 moved in

CHILD = f"""
import os, shutil, signal, sys
from pathlib import Path
import captioner.core.files as files

folder, how = Path(sys.argv[1]), sys.argv[2]
renames, rename, rmtree = [], os.rename, shutil.rmtree

def killed_at_rename(source, target):
    renames.append(source)
    if how == f"rename{{len(renames)}}":
        os.kill(os.getpid(), signal.SIGKILL)
    rename(source, target)

def killed_removing_the_earlier_set(path, *args, **kwargs):
    if how == "aside" and "earlier" in Path(path).name:
        os.kill(os.getpid(), signal.SIGKILL)
    rmtree(path, *args, **kwargs)

files.os.rename, files.shutil.rmtree = killed_at_rename, killed_removing_the_earlier_set
with files.staged_folder(folder, {sorted(REPLACES)!r}, marker={MARKER!r}) as stage:
    for name, data in {NEW!r}.items():
        (stage / name).parent.mkdir(parents=True, exist_ok=True)
        (stage / name).write_bytes(data)
    print("writing", flush=True)
    if how == "hold":
        sys.stdin.readline()
    if how == "write":
        os.kill(os.getpid(), signal.SIGKILL)
"""


def write(folder: Path, files: dict[str, bytes]) -> None:
    """`files` (relative name: bytes) written into `folder`."""
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


def contents(folder: Path, hidden: bool = True) -> dict[str, bytes | None]:
    """Every entry under `folder` (the hidden staging ones too, unless `hidden` is False): a file's bytes, None for a
    folder."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))
            if hidden or not p.relative_to(folder).parts[0].startswith(".captioner-staged-")}


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".captioner-staged-"))


def child(folder: Path, how: str) -> subprocess.Popen:
    """A process exporting the new set into `folder` with `staged_folder`, killed (SIGKILL, by itself) as `how`
    says: `write` while it writes the set, `renameK` at the K-th rename of its swap, `aside` as it removes the
    earlier set after the swap; `hold` waits, inside the block, for a line on its stdin."""
    return subprocess.Popen([sys.executable, "-c", CHILD, str(folder), how], env=subprocess_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A folder holding an earlier complete set, written by `staged_folder`, and a file of the user's beside it."""
    folder = tmp_path / "export"
    with staged_folder(folder, REPLACES, MARKER) as stage:
        write(stage, EARLIER)
    write(folder, {"notes.txt": b"the user's own"})
    return folder


def test_a_second_export_into_a_folder_being_written_is_refused_in_one_line_and_leaves_no_trace(folder: Path) -> None:
    """Two exports into one folder at once interleaved their swaps; now the folder's lock (a flock held by the
    other process) refuses the second before it does anything, and the first completes."""
    writer = child(folder, "hold")
    try:
        assert writer.stdout.readline() == "writing\n"
        before = contents(folder)
        with pytest.raises(StorageError) as refused, staged_folder(folder, REPLACES, MARKER) as stage:
            write(stage, {MARKER: b"a third set"})
        assert str(refused.value) == f"{folder}: another export is writing into this folder; wait for it to finish"
        assert contents(folder) == before
    finally:
        writer.communicate("go on\n", timeout=60)
    assert writer.returncode == 0
    assert contents(folder) == {"graphs": None, **NEW, "notes.txt": b"the user's own"}


def test_the_set_a_killed_export_was_writing_is_removed_by_the_next_one(folder: Path) -> None:
    before = contents(folder)
    killed = child(folder, "write")
    killed.communicate(timeout=60)
    assert killed.returncode == -9 and len(hidden(folder)) == 1  # its new set, never swapped in
    assert contents(folder, hidden=False) == before
    with staged_folder(folder, REPLACES, MARKER) as stage:
        write(stage, NEW)
    assert hidden(folder) == [] and contents(folder) == {"graphs": None, **NEW, "notes.txt": b"the user's own"}


@pytest.mark.parametrize("renames", range(1, RENAMES + 1))
def test_a_swap_cut_short_by_a_kill_is_rolled_back_by_the_next_export(folder: Path, renames: int) -> None:
    """Killed at any rename of its swap (the earlier entries moved aside, then the new ones moved in, the marker
    last), an export leaves the folder without its marker and the earlier set in a hidden folder; the next export
    moves that set back, byte for byte, before it writes its own, and then completes."""
    before = contents(folder)
    killed = child(folder, f"rename{renames}")
    killed.communicate(timeout=60)
    assert killed.returncode == -9
    if renames > 1:
        assert not (folder / MARKER).exists()  # the earlier marker set aside first, the new one not yet in
    with staged_folder(folder, REPLACES, MARKER) as stage:
        assert contents(folder, hidden=False) == before  # the earlier complete set, back in its place
        assert hidden(folder) == [stage.name]
        write(stage, {**NEW, MARKER: b"a third set"})
    assert hidden(folder) == []
    assert contents(folder) == {"graphs": None, **NEW, MARKER: b"a third set", "notes.txt": b"the user's own"}


def test_an_earlier_set_left_after_a_completed_swap_is_just_removed(folder: Path) -> None:
    """Killed as it removed the earlier set, after the new one (its marker last) was all in: the swap completed, so
    the next export deletes the earlier set and keeps the new one until its own takes its place."""
    killed = child(folder, "aside")
    killed.communicate(timeout=60)
    assert killed.returncode == -9 and len(hidden(folder)) == 2  # the earlier set, and the emptied new one
    with staged_folder(folder, REPLACES, MARKER) as stage:
        assert contents(folder, hidden=False) == {"graphs": None, **NEW, "notes.txt": b"the user's own"}
        assert hidden(folder) == [stage.name]
    assert hidden(folder) == []


def test_a_site_whose_swap_was_cut_short_is_still_a_site(folder: Path, tmp_path: Path) -> None:
    """A site's swap cut short leaves its site.json set aside and a few new page files in: the next `--web` export
    must not refuse the folder as "not a site" before it can move the earlier site back."""
    from captioner.apps.web_site import check_site_folder

    site = tmp_path / "site"
    write(site, {"index.html": b"new page", ".captioner-staged-abc123-earlier-site.json.tmp/site.json": b"{}"})
    check_site_folder(site)
    (site / ".captioner-staged-abc123-earlier-site.json.tmp" / "site.json").unlink()
    with pytest.raises(Exception, match="not empty and not a captioner web site"):
        check_site_folder(site)


def test_web_export_refuses_a_folder_that_is_not_a_site_before_loading_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture,
) -> None:
    """`export --web` into a folder holding other files loaded the model first (seconds to minutes) and only then
    refused the folder; now the refusal comes first: a model that cannot even be read is never opened."""
    pytest.importorskip("onnx")
    (tmp_path / "model.pt").write_bytes(b"not a checkpoint")
    write(tmp_path / "mine", {"thesis.tex": b"keep"})
    capsys.readouterr()
    assert main(["export", str(tmp_path / "model.pt"), str(tmp_path / "mine"), "--web"]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'mine'}: not empty and not a captioner web site; "
                                       "give a new or empty folder\n")
    assert contents(tmp_path / "mine") == {"thesis.tex": b"keep"}


@pytest.mark.parametrize("package", [{}, {"package.json": b"[]"},
                                     {"package.json": b'{"name": "onnxruntime-web", "version": "0.1.0"}'}])
def test_web_export_refuses_a_wrong_ort_before_loading_the_model(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                  package: dict[str, bytes]) -> None:
    """`export --web --ort` checked the onnxruntime-web package only once the model had loaded; now first, as the
    folder is: a model that cannot even be read is never opened, and a package.json that is no object is one line."""
    pytest.importorskip("onnx")
    (tmp_path / "model.pt").write_bytes(b"not a checkpoint")
    write(tmp_path / "ort", package)
    (tmp_path / "ort").mkdir(exist_ok=True)
    capsys.readouterr()
    assert main(["export", str(tmp_path / "model.pt"), str(tmp_path / "site"), "--web", "--ort",
                 str(tmp_path / "ort")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --ort {tmp_path / 'ort'}: "), err
    assert not (tmp_path / "site").exists()


@pytest.mark.parametrize("fields", [{"packaged": "terms"}, {"training_config": "a recipe"},
                                    {"training_config": {"data": ["shapes"]}}, {"packaged": {"data_terms": ["x"]}}])
def test_web_export_of_an_export_whose_card_fields_have_other_shapes_goes_without_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fields: dict[str, object],
) -> None:
    """`export --web` of a stranger's export read its data terms through config.json's packaged and training_config
    as mappings: a string or a list there was an AttributeError traceback. A field of another shape is left out."""
    from helpers import tiny_model

    from captioner.apps import web_site
    from captioner.apps.export import export_model

    folder = tmp_path / "model"
    tiny_model().save_pretrained(folder, **fields)
    written: list[object] = []
    monkeypatch.setattr(web_site, "write_site", lambda model, site, ort, terms: written.append(terms) or [])
    export_model(folder, tmp_path / "site", web=True)
    assert written == [None]
