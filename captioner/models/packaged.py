"""The model installed with the package, like spaCy's `en_core_web_sm`: an exported folder at
`captioner/pretrained/<name>/` that loads offline, checked as any export and against pip's RECORD."""

from __future__ import annotations

import base64
import hashlib
from importlib import metadata
from pathlib import Path

from captioner.core.errors import ExportError
from captioner.models.export_format import CONFIG, Exported, read_config, read_exported

PACKAGED_FOLDER = Path(__file__).resolve().parents[1] / "pretrained"  # captioner/pretrained, wherever installed
MAX_BYTES = 20_000_000  # a packaged model's files together: the wheel and every install carry them
REINSTALL = (
    "reinstall captioner to repair it (pip install --force-reinstall captioner, or pip install . from its clone)"
)


def packaged_models() -> list[Path]:
    """The folders of the packaged models, by name (none before a model is packaged)."""
    root = PACKAGED_FOLDER
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def is_packaged(path: str | Path) -> bool:
    """Whether `path` is a packaged model's folder."""
    return Path(path).resolve().parent == PACKAGED_FOLDER.resolve()


def installed_model() -> Path | None:
    """The packaged default model's folder, its config.json checked, or None; several are an error."""
    found = packaged_models()
    if not found:
        return None
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise ExportError(f"{PACKAGED_FOLDER}: holds {len(found)} packaged models ({names}), "
                          f"and the package ships one default model; {REINSTALL}")
    verify_installed_file(found[0] / CONFIG)  # config.json: there, as the installer wrote it, and readable
    try:
        read_config(found[0])
    except ExportError as e:
        raise ExportError(f"{e}; {REINSTALL}") from None
    return found[0]


def packaged_model(name: str) -> Path | None:
    """The packaged model called `name` (its folder's name), or None."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return None
    return next((p for p in packaged_models() if p.name == name), None)


def read_packaged(folder: Path) -> Exported:
    """A packaged model's export, every file checked, a failure one line saying how to reinstall."""
    verify_installed_file(folder / CONFIG)
    return read_exported(folder, REINSTALL)


def verify_installed_file(path: Path) -> None:
    """Check `path` against the sha256 and size pip's RECORD holds for it, if any (not a clone's)."""
    recorded = installer_record(path)
    if recorded is None:
        return
    digest, size = recorded
    if not path.is_file():
        raise ExportError(f"{path}: missing; {REINSTALL}")
    data = path.read_bytes()
    found = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")  # as RECORD has it
    if (size is not None and len(data) != size) or found != digest:
        raise ExportError(f"{path}: not the file captioner was installed with (its sha256 differs from the "
                          f"installer's record); {REINSTALL}")


def installer_record(path: Path) -> tuple[str, int | None] | None:
    """The sha256 (RECORD's urlsafe base64) and size the installer recorded for `path`, or None."""
    try:
        distribution = metadata.distribution("captioner")
    except metadata.PackageNotFoundError:
        return None
    target = path.resolve()
    for file in distribution.files or []:
        if file.hash is None or file.hash.mode != "sha256" or file.name != path.name:
            continue
        if Path(distribution.locate_file(file)).resolve() == target:
            return file.hash.value, file.size
    return None
