"""Hugging Face Hub repos: whether a name is a repo id ("owner/name"), and the local folder of one.

The folder is an export, fetched into the cache or found there offline; else one line says why."""

from __future__ import annotations

import os
import re
from pathlib import Path

from captioner.core.errors import ExportError
from captioner.models.export_format import CARD, CONFIG, VOCAB, WEIGHTS, is_exported

HUB_FILES = [CONFIG, VOCAB, WEIGHTS, CARD, "*.jpg", "*.png", "onnx/*"]  # what a download fetches
# owner/name as the Hub spells repo ids: letters, digits, "-", "_", "." (not at the ends)
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


def looks_like_repo_id(name: str) -> bool:
    """owner/name, and not a missing checkpoint file's path (runs/best.pt)."""
    return bool(REPO_ID.match(name)) and ".." not in name and not name.endswith((".pt", ".pth", ".ckpt", ".bin"))


def network_errors() -> tuple[type[Exception], ...]:
    """The installed base classes of the HTTP client errors huggingface_hub lets through (requests,
    httpx or httpx2, by version)."""
    found: list[type[Exception]] = []
    for module, name in (("httpx2", "HTTPError"), ("httpx", "HTTPError"), ("requests", "RequestException")):
        try:
            found.append(getattr(__import__(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def hub_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The local folder of Hub repo `repo_id`; one-line ExportError when it cannot be had."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError, HfHubHTTPError, HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:  # pragma: no cover - a declared dependency
        raise ExportError(
            f"{repo_id}: loading a Hub repo id needs huggingface_hub (pip install huggingface_hub)"
        ) from None
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILES, local_files_only=offline)
    except LocalEntryNotFoundError:
        reason = "offline (HF_HUB_OFFLINE is set)" if offline else "the Hub cannot be reached"
        raise ExportError(
            f"{repo_id}: not a local folder or checkpoint, and {reason} with no cached copy of this Hub repo"
        ) from None
    except (RepositoryNotFoundError, GatedRepoError):
        raise ExportError(
            f"{repo_id}: no such Hub repo, or it is private or gated (set HF_TOKEN to a token that can read it)"
        ) from None
    except RevisionNotFoundError:
        raise ExportError(f"{repo_id}: no revision {revision!r} on the Hub") from None
    except HFValidationError:
        raise ExportError(f"{repo_id}: not a valid Hub repo id (owner/name)") from None
    except (HfHubHTTPError, OSError, *network_errors()) as e:  # HTTP and connection errors, a full cache disk
        raise ExportError(f"{repo_id}: could not download from the Hub ({str(e).splitlines()[0][:160]})") from None
    if not is_exported(folder):
        raise ExportError(f"{repo_id}: the Hub repo has no {CONFIG}; it is not a captioner export")
    return Path(folder)
