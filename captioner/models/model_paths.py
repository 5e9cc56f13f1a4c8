"""Where models are: what a model path means (a checkpoint file, an exported folder, a run folder, a
packaged model's name or a Hub repo id), the models packaged with captioner, and the default model."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
from importlib import metadata
from pathlib import Path

from captioner.core.errors import CheckpointError, ExportError, first_line
from captioner.models.export_format import (
    CARD, CONFIG, VOCAB, WEIGHTS, Exported, SizeCheck, is_exported, read_config, read_exported,
)

RUN_CHECKPOINTS = ("best.pt", "last.pt")  # what a run folder is loaded from, first found first
HUB_FILES = [CONFIG, VOCAB, WEIGHTS, CARD, "*.jpg", "*.png", "onnx/*"]  # what a download fetches
# owner/name as the Hub spells repo ids: letters, digits, "-", "_", "." (not at the ends)
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
DEFAULT_MODEL = Path("runs/default_model")
"""The user's best model for photographs, relative to the project folder
(`captioner export runs/<best run> runs/default_model`); it wins over the packaged one."""
QUICKSTART_RUN = Path("runs/shapes_lstm")  # configs/shapes_lstm.yaml's train.out_dir
PACKAGED_FOLDER = Path(__file__).resolve().parents[1] / "pretrained"  # captioner/pretrained, wherever installed
MAX_BYTES = 20_000_000  # a packaged model's files together: the wheel and every install carry them
REINSTALL = (
    "reinstall captioner to repair it (pip install --force-reinstall captioner, or pip install . from its clone)"
)

log = logging.getLogger(__name__)


def checkpoint_file(path: str | Path) -> Path:
    """A checkpoint file or exported folder as given; a run folder's best.pt, else last.pt; else a
    packaged model's name; else a Hub repo id ("owner/name"), fetched into the cache."""
    name = str(path)
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        if is_exported(path):
            return path
        for candidate in RUN_CHECKPOINTS:
            if (path / candidate).is_file():
                return path / candidate
            if os.path.lexists(path / candidate):  # never another checkpoint than the one the user has in its place
                raise CheckpointError(f"{path / candidate}: not a checkpoint file (a folder, a pipe or a device, or "
                                      f"a link that leads nowhere); move it aside to load the run's other checkpoint")
        raise CheckpointError(f"{path}: a folder without a model (no {' or '.join(RUN_CHECKPOINTS)}, no {CONFIG})")
    if os.path.lexists(path):  # there, but neither a file nor a folder: the user's, never a model's name for another
        raise CheckpointError(f"{path}: not a checkpoint file (a pipe, a device or a socket, or a link that leads "
                              "nowhere)")
    if (packaged := packaged_model(name)) is not None:
        return packaged
    if looks_like_repo_id(name):
        return hub_snapshot(name)
    raise CheckpointError(f"{path}: checkpoint not found (no such file, run folder, exported folder or Hub repo id)")


def looks_like_repo_id(name: str) -> bool:
    """owner/name, and not a missing checkpoint file's path (runs/best.pt)."""
    return bool(REPO_ID.match(name)) and ".." not in name and not name.endswith((".pt", ".pth", ".ckpt", ".bin"))


def network_errors() -> tuple[type[Exception], ...]:
    """The installed base classes of the HTTP errors huggingface_hub lets through (requests, httpx)."""
    found: list[type[Exception]] = []
    for module, name in (("httpx2", "HTTPError"), ("httpx", "HTTPError"), ("requests", "RequestException")):
        try:
            found.append(getattr(__import__(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def hub_snapshot(repo_id: str) -> Path:
    """The local folder of Hub repo `repo_id`, an export fetched into the cache or found there offline."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError, HfHubHTTPError, HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError,
        )
    except ImportError:  # pragma: no cover - a declared dependency
        raise ExportError(
            f"{repo_id}: loading a Hub repo id needs huggingface_hub (pip install huggingface_hub)"
        ) from None
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    try:
        folder = snapshot_download(repo_id, allow_patterns=HUB_FILES, local_files_only=offline)
    except LocalEntryNotFoundError:
        reason = "offline (HF_HUB_OFFLINE is set)" if offline else "the Hub cannot be reached"
        raise ExportError(
            f"{repo_id}: not a local folder or checkpoint, and {reason} with no cached copy of this Hub repo"
        ) from None
    except (RepositoryNotFoundError, GatedRepoError):
        raise ExportError(
            f"{repo_id}: no such Hub repo, or it is private or gated (set HF_TOKEN to a token that can read it)"
        ) from None
    except HFValidationError:
        raise ExportError(f"{repo_id}: not a valid Hub repo id (owner/name)") from None
    except (HfHubHTTPError, OSError, *network_errors()) as e:  # HTTP and connection errors, a full cache disk
        raise ExportError(f"{repo_id}: could not download from the Hub ({first_line(e, 160)})") from None
    if not is_exported(folder):
        raise ExportError(f"{repo_id}: the Hub repo has no {CONFIG}; it is not a captioner export")
    return Path(folder)


def packaged_models() -> list[Path]:
    """The folders of the packaged models, by name (none before a model is packaged): exported folders at
    `captioner/pretrained/<name>/`, like spaCy's `en_core_web_sm`, loading offline, checked against pip's RECORD."""
    if not PACKAGED_FOLDER.is_dir():
        return []
    return sorted(p for p in PACKAGED_FOLDER.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


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


def read_packaged(folder: Path, size_check: SizeCheck | None = None) -> Exported:
    """A packaged model's export, every file checked (`read_exported`), a failure one line saying how to reinstall."""
    verify_installed_file(folder / CONFIG)
    return read_exported(folder, REINSTALL, size_check)


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


def find_default_model() -> Path:
    """What to load when no model is named, logged: the export at DEFAULT_MODEL if that folder exists
    (a broken one is an error, not a fallback), else the packaged model, else the trained shapes run."""
    folder = DEFAULT_MODEL
    if folder.exists():
        if not folder.is_dir():
            raise ExportError(f"{folder}: not a folder; the default model is an exported folder "
                              f"(`captioner export RUN {folder}`), or remove it to use the shapes model")
        if not is_exported(folder):  # `export` writes config.json last: an export cut short lacks it
            raise ExportError(f"{folder / CONFIG}: missing, so {folder} holds no complete export; "
                              f"re-run `captioner export RUN {folder}` or remove the folder to use the shapes model")
        read_config(folder)  # a damaged config.json: its one line now, before the choice is logged
        log.info("default model: the export at %s", folder)
        return folder
    packaged = installed_model()
    if packaged is not None:
        log.info("default model: %s, packaged with captioner (no export at %s)", packaged.name, folder)
        return packaged
    log.info("default model: the shapes run %s (no export at %s, no packaged model)", QUICKSTART_RUN, folder)
    if any((QUICKSTART_RUN / name).is_file() for name in RUN_CHECKPOINTS):
        return QUICKSTART_RUN
    raise CheckpointError(
        f"no default model here: no export at {DEFAULT_MODEL} (`captioner export runs/<best run> {DEFAULT_MODEL}`), "
        f"no model packaged with captioner, and no trained {QUICKSTART_RUN} "
        "(`captioner train configs/shapes_lstm.yaml`); run from the project folder"
    )
