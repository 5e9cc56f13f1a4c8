"""SPICE's Stanford CoreNLP models (about 400 MB): found, or downloaded once within a time bound.
pycocoevalcap's own downloader has none; when the models cannot be had, one warning says how."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from captioner.evaluation.java import log_output

logger = logging.getLogger(__name__)

# The download runs in a child process bounded by these, after a reachability probe so that an
# offline machine gives up in seconds.
SPICE_PROBE_TIMEOUT_S = 20.0
SPICE_DOWNLOAD_TIMEOUT_S = 1800.0


def _spice_lib_dir() -> Path:
    """Where pycocoevalcap's SPICE jar looks for CoreNLP (its manifest's Class-Path: lib/...)."""
    from pycocoevalcap.spice import get_stanford_models as gsm

    return Path(gsm.SPICEDIR).resolve() / gsm.SPICELIB


def _spice_model_files() -> list[Path]:
    from pycocoevalcap.spice import get_stanford_models as gsm

    lib = _spice_lib_dir()
    return [lib / f"{gsm.JAR}.jar", lib / f"{gsm.JAR}-models.jar"]


def _spice_models_url() -> str:
    """The address pycocoevalcap.spice.get_stanford_models downloads from."""
    from pycocoevalcap.spice import get_stanford_models as gsm

    return f"http://nlp.stanford.edu/software/{gsm.CORENLP}.zip"


def missing_spice_models() -> list[Path]:
    """The Stanford CoreNLP jars SPICE needs that are not installed (empty when SPICE can run)."""
    return [path for path in _spice_model_files() if not path.is_file()]


_PROBE = ("import sys, urllib.request as u; "
          "u.urlopen(u.Request(sys.argv[1], method='HEAD'), timeout=float(sys.argv[2])).close()")


def _run_python(name: str, args: list[str], timeout: float, late: str, failed: str) -> str | None:
    """Run `python args` as a child bounded by `timeout` s, its output logged under `name`; None on
    success, else why not: "`late` within N s", or "`failed` (the last line of its stderr)"."""
    try:
        proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{late} within {timeout:.0f} s"
    log_output(name, proc.stdout)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
        return f"{failed} ({last})"
    return None


def _probe_spice_models_url() -> str | None:
    """None if the download address answers, else why not. In a child process so that even a
    hanging name lookup is bounded."""
    url = _spice_models_url()
    return _run_python("probe", ["-c", _PROBE, url, str(SPICE_PROBE_TIMEOUT_S / 2)], SPICE_PROBE_TIMEOUT_S,
                       f"{url} did not answer", f"{url} is unreachable")


def _download_spice_models() -> str | None:
    """Run pycocoevalcap's own downloader, bounded in time; None on success, else why not."""
    code = "from pycocoevalcap.spice.get_stanford_models import get_stanford_models; get_stanford_models()"
    return _run_python("get_stanford_models", ["-c", code], SPICE_DOWNLOAD_TIMEOUT_S, "the download did not finish",
                       "the download failed")


def ensure_spice_models() -> bool:
    """True if SPICE's CoreNLP models are installed, downloading them (bounded) if need be; else log
    one warning that says how to get them."""
    missing = missing_spice_models()
    if not missing:
        return True
    lib = _spice_lib_dir()
    if len(missing) == 1 and missing[0].name.endswith("-models.jar"):
        # pycocoevalcap's downloader checks only the code jar, so it would never fetch this one.
        reason = f"{missing[0].name} is missing (an interrupted download?)"
    else:
        logger.info("SPICE needs the Stanford CoreNLP 3.6.0 models (about 400 MB, downloaded once) in %s", lib)
        reason = _probe_spice_models_url() or _download_spice_models()
        if reason is None and not missing_spice_models():
            return True
        reason = reason or f"the download did not produce {', '.join(p.name for p in missing_spice_models())}"
    logger.warning("SPICE skipped: the Stanford CoreNLP 3.6.0 models are not in %s and could not be downloaded: %s. "
                   "To enable it, run `python -m pycocoevalcap.spice.get_stanford_models` with internet access, or "
                   "copy %s and %s from %s into that folder",
                   lib, reason, *(p.name for p in _spice_model_files()), _spice_models_url())
    return False
