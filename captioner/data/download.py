"""Download and unpack the COCO and Flickr8k caption data sets (`captioner data coco|flickr8k --root DIR`).
Archives are size and MD5 checked, resumably (urllib only), and extracted in the layout the loaders read."""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import re
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from tqdm import tqdm

from captioner.core.errors import DatasetError
from captioner.core.files import make_folder
from captioner.core.machine_cache import folder_held
from captioner.core.progress import progress_bar
from captioner.data.flickr8k import SPLIT_FILES, TOKEN_FILE, default_image_folder

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RemoteFile:
    """One archive to fetch: its file name, official URL, size in bytes and MD5 (None if unknown)."""

    name: str
    url: str
    size: int | None
    md5: str | None
    group: str  # "2014", "2017", "karpathy" (which call of `download_coco` wants it) or "flickr8k"


# Sizes: tensorflow_datasets/url_checksums/coco_captions.txt. MD5s: PaddlePaddle/PaddleDetection
# dataset/coco/download_coco.py (also salesforce/LAVIS for 2014, MLPerf's scripts for 2017).
COCO_FILES: tuple[RemoteFile, ...] = (
    RemoteFile("train2014.zip", "http://images.cocodataset.org/zips/train2014.zip",
               13_510_573_713, "0da8c0bd3d6becc4dcb32757491aca88", "2014"),
    RemoteFile("val2014.zip", "http://images.cocodataset.org/zips/val2014.zip",
               6_645_013_297, "a3d79f5ed8d289b7a7554ce06a5782b3", "2014"),
    RemoteFile("annotations_trainval2014.zip", "http://images.cocodataset.org/annotations/annotations_trainval2014.zip",
               252_872_794, "0a379cfc70b0e71301e0f377548639bd", "2014"),
    RemoteFile("train2017.zip", "http://images.cocodataset.org/zips/train2017.zip",
               19_336_861_798, "cced6f7f71b7629ddf16f17bbcfab6b2", "2017"),
    RemoteFile("val2017.zip", "http://images.cocodataset.org/zips/val2017.zip",
               815_585_330, "442b8da7639aecaf257c1dceb8ba8c80", "2017"),
    RemoteFile("annotations_trainval2017.zip", "http://images.cocodataset.org/annotations/annotations_trainval2017.zip",
               252_907_541, "f4bbac642086de4f52a3fdda2de5fa2c", "2017"),
    # dataset_{coco,flickr8k,flickr30k}.json; no credible MD5 is published: only its size is checked.
    RemoteFile("caption_datasets.zip", "https://cs.stanford.edu/people/karpathy/deepimagesent/caption_datasets.zip",
               36_745_453, None, "karpathy"),
)
YEARS = ("2014", "2017")

# The copies of Flickr8k's two archives that tutorials and libraries fetch, with their published
# MD5s; no confirmed sizes, so the server's Content-Length stands in.
_FLICKR8K_URL = "https://github.com/jbrownlee/Datasets/releases/download/Flickr8k/"
FLICKR8K_FILES: tuple[RemoteFile, ...] = (
    # The caption and split files first: 2.3 MB that fail fast on a bad link, before 1.1 GB of photos.
    RemoteFile("Flickr8k_text.zip", _FLICKR8K_URL + "Flickr8k_text.zip", None,
               "bf6c1abcb8e4a833b7f922104de18627", "flickr8k"),
    # Flicker8k_Dataset/ (sic) with the 8,091 JPEGs.
    RemoteFile("Flickr8k_Dataset.zip", _FLICKR8K_URL + "Flickr8k_Dataset.zip", None,
               "f18a1e2920de5bd84dae7cf08ec78978", "flickr8k"),
)

CHUNK_BYTES = 1 << 20
TIMEOUT_S = 60.0
MAX_ATTEMPTS = 4  # consecutive attempts that make no progress before giving up
RETRY_BACKOFF_S = 1.0  # doubled after every failed attempt
USER_AGENT = "captioner-downloader (python urllib)"


class _Interrupted(ConnectionError):
    """The server closed the connection before sending the whole body (retried and resumed)."""


def download_file(url: str, dest: Path, expected_size: int | None = None, md5: str | None = None,
                  progress: bool = True) -> Path:
    """Download `url` to `dest` via a resumed `dest` + ".part", renamed once its size and MD5 check."""
    dest = Path(dest)
    if dest.is_file():
        if expected_size in (None, dest.stat().st_size) and (md5 is None or _md5(dest) == md5.lower()):
            logger.info("%s already downloaded, skipping", dest)
            return dest
        logger.warning("%s does not have the expected size or checksum, downloading again", dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(dest.suffix + ".part")
    total = _fetch(url, part, expected_size, progress)
    size = part.stat().st_size
    if total is not None and size != total:
        part.unlink()
        raise DatasetError(f"{dest.name}: downloaded {size} bytes from {url}, expected {total}")
    if md5 is not None:
        logger.info("verifying the MD5 of %s", dest.name)
        actual = _md5(part)
        if actual != md5.lower():
            part.unlink()
            raise DatasetError(f"{dest.name}: checksum mismatch (expected md5 {md5}, got {actual}); "
                               f"removed the corrupt download, run again to retry")
    os.replace(part, dest)  # atomic on one file system: dest is either absent or complete
    logger.info("downloaded %s", dest)
    return dest


def download_coco(root: Path, year: str = "2014", karpathy: bool = False, mirror: str | None = None,
                  progress: bool = True) -> list[Path]:
    """Download and unpack COCO `year` (and Karpathy's splits) into `root`; the top-level paths extracted."""
    year = str(year)
    if year not in YEARS:
        raise DatasetError(f"unknown COCO year {year!r}: choose one of {', '.join(YEARS)}")
    wanted = [f for f in COCO_FILES if f.group == year or (karpathy and f.group == "karpathy")]
    return _download_and_extract(wanted, Path(root), mirror, progress)


def download_flickr8k(root: Path, mirror: str | None = None, progress: bool = True) -> list[Path]:
    """Download and unpack Flickr8k into `root` as `load_flickr8k` reads it; the top-level paths extracted."""
    root = Path(root)
    extracted = _download_and_extract(FLICKR8K_FILES, root, mirror, progress)
    missing = [name for name in (TOKEN_FILE, *SPLIT_FILES.values()) if not (root / name).is_file()]
    if not default_image_folder(root).is_dir():
        missing.append("Flicker8k_Dataset/")
    if missing:  # a mirror serving other archives under these names
        raise DatasetError(f"{root}: the Flickr8k archives did not unpack {', '.join(missing)} "
                           f"there; check the files in {root / 'downloads'}")
    return extracted


def _download_and_extract(wanted: Sequence[RemoteFile], root: Path, mirror: str | None, progress: bool) -> list[Path]:
    """Fetch each archive into root/downloads/ and extract it into `root` once; the top-level paths extracted. The
    folder is held meanwhile: a second download into it waits, saying so, then finds the archives extracted, instead
    of appending to the same .part files."""
    urls = [_apply_mirror(remote.url, mirror) for remote in wanted]  # a bad mirror fails first
    downloads = _make_folder(_make_folder(root) / "downloads")
    with folder_held("download", downloads, f"downloading into {root}", logger):
        return [path for remote, url in zip(wanted, urls) for path in _fetched(remote, url, root, downloads, progress)]


def _fetched(remote: RemoteFile, url: str, root: Path, downloads: Path, progress: bool) -> list[Path]:
    """The top-level paths `remote`'s archive unpacked into `root`: downloaded and extracted unless its marker says
    it was and they are there."""
    marker = downloads / f"{remote.name}.extracted"
    if marker.is_file():
        paths = [root / line for line in marker.read_text().splitlines() if line]
        if all(p.exists() for p in paths):
            logger.info("%s already downloaded and extracted, skipping", remote.name)
            return paths
        logger.warning("files extracted from %s are missing, extracting again", remote.name)
    archive = download_file(url, downloads / remote.name, remote.size, remote.md5, progress)
    tops = _extract(archive, root, progress)
    # Written last: a crash mid-extraction leaves no marker, so the next call re-extracts.
    marker.write_text("".join(f"{t}\n" for t in tops))
    return [root / t for t in tops]


def _make_folder(path: Path) -> Path:
    """Create `path` (and its parents): a file in the way or no permission is a one-line error."""
    return make_folder(path, str(path), DatasetError, "to download into")


def _fetch(url: str, part: Path, total: int | None, progress: bool) -> int | None:
    """Fill `part` with the body of `url` (`total` bytes, if known), resuming and retrying; the total size if known."""
    failures = 0
    with progress_bar(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                      desc=part.name.removesuffix(".part"), enabled=progress) as bar:
        while True:
            offset = part.stat().st_size if part.exists() else 0
            if total is not None and offset > total:  # a stale .part of another file version
                part.unlink()
                offset = 0
            if total is not None and offset == total:
                return total
            try:
                return _transfer(url, part, offset, total, bar)
            except urllib.error.HTTPError as e:
                if e.code == 416 and _complete_after_416(e, part):
                    return part.stat().st_size
                if e.code == 416:  # the .part does not fit what the server has: start over
                    part.unlink(missing_ok=True)
                elif e.code < 500:  # 4xx will not change on retry
                    raise DatasetError(f"cannot download {url}: HTTP {e.code} {e.reason}") from None
                error: Exception = e
            except (OSError, http.client.HTTPException) as e:  # includes URLError, timeouts
                error = e
            # Only consecutive attempts without progress count: a flaky link may still finish.
            grew = part.exists() and part.stat().st_size > offset
            failures = 0 if grew else failures + 1
            if failures >= MAX_ATTEMPTS:
                raise _give_up(url, part, error) from None
            delay = RETRY_BACKOFF_S * 2 ** max(failures - 1, 0)
            # the last failure is the one line said
            logger.debug("download of %s failed (%s), retrying in %.0f s", url, error, delay)
            time.sleep(delay)


def _transfer(url: str, part: Path, offset: int, total: int | None, bar: tqdm) -> int | None:
    """Make one request for `url` from byte `offset` and append it to `part`."""
    headers = {"User-Agent": USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        length = response.headers.get("Content-Length")
        length = int(length) if length is not None and length.isdigit() else None
        if response.status == 206:
            content_range = (response.headers.get("Content-Range") or "").strip()
            match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", content_range)
            if match is None or int(match[1]) != offset:
                part.unlink(missing_ok=True)  # an answer for bytes we did not ask for
                raise _Interrupted(f"unexpected Content-Range {content_range!r}")
            served = int(match[3]) if match[3] != "*" else (offset + length if length else None)
        else:
            if offset:
                logger.info("server ignored the Range request for %s, restarting from 0", url)
                offset = 0
            served = length
        if served is not None and total is not None and served != total:
            raise DatasetError(f"{url}: server reports {served} bytes, expected {total} "
                               f"(the file changed upstream, or the mirror holds another file)")
        total = served if served is not None else total
        free = shutil.disk_usage(part.parent).free  # fail now rather than with a full disk at 95 %
        if total is not None and free < total - offset:
            raise DatasetError(f"not enough disk space for {part.parent / part.stem}: "
                               f"needs {(total - offset) / 1e9:.1f} GB, {free / 1e9:.1f} GB free")
        bar.reset(total=total)
        bar.update(offset)
        written = 0
        with _local_io(part, open, part, "ab" if offset else "wb") as out:
            # Network errors from read() propagate to the retry loop; disk errors do not.
            while chunk := response.read(CHUNK_BYTES):
                _local_io(part, out.write, chunk)
                written += len(chunk)
                bar.update(len(chunk))
    # http.client returns a short body silently when the connection drops: check it ourselves.
    if total is not None and offset + written < total:
        raise _Interrupted(f"connection closed after {offset + written} of {total} bytes")
    return total


def _local_io(part: Path, op: Callable[..., T], *args: object) -> T:
    """Run a local file operation; a full disk or bad permissions is a user error, not a retry."""
    try:
        return op(*args)
    except OSError as e:
        raise DatasetError(f"cannot write {part}: {e.strerror or e}") from None


def _complete_after_416(error: urllib.error.HTTPError, part: Path) -> bool:
    """A 416 to `bytes=N-` with `Content-Range: bytes */N` means the .part is already whole."""
    match = re.fullmatch(r"bytes \*/(\d+)", (error.headers.get("Content-Range") or "").strip())
    return match is not None and part.exists() and part.stat().st_size == int(match[1])


def _give_up(url: str, part: Path, error: Exception) -> DatasetError:
    """The one line after the last attempt: what could not be had, and how to give it by hand."""
    dest = part.with_name(part.name.removesuffix(".part"))
    kept = f"; run again to resume from {part}" if part.exists() else ""
    by_hand = f"; or fetch it by hand, save it as {dest} and run this again"
    if isinstance(error, urllib.error.HTTPError):
        return DatasetError(f"cannot download {url}: HTTP {error.code} {error.reason}{kept}{by_hand}")
    if isinstance(error, urllib.error.URLError):  # the connection itself could not be made
        host = urllib.parse.urlsplit(url).netloc or url
        return DatasetError(f"cannot reach {host}: no internet? ({error.reason}) "
                            f"while downloading {url}{kept}{by_hand}")
    return DatasetError(f"download of {url} kept failing ({error}){kept}{by_hand}")


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)  # an integrity check, fine on FIPS systems
    with open(path, "rb") as f:
        while block := f.read(CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def _apply_mirror(url: str, mirror: str | None) -> str:
    """Swap the scheme and host of `url` for the `mirror` base URL (which may add a path prefix)."""
    if not mirror:
        return url
    base = urllib.parse.urlsplit(mirror)
    if not base.scheme or not base.netloc:
        raise DatasetError(f"mirror {mirror!r} is not a base URL like http://host:port/path")
    path = urllib.parse.urlsplit(url).path
    return f"{base.scheme}://{base.netloc}{base.path.rstrip('/')}{path}"


def _extract(archive: Path, root: Path, progress: bool) -> list[str]:
    """Extract `archive` into `root`; return the top-level names it created, in order."""
    try:
        with zipfile.ZipFile(archive) as zf:
            # A Mac's zip (Flickr8k_Dataset.zip) has a __MACOSX/ tree of resource forks: never extracted.
            members = [m for m in zf.infolist() if not m.filename.startswith("__MACOSX/")]
            for member in progress_bar(members, unit="file", desc=f"extracting {archive.name}", enabled=progress):
                zf.extract(member, root)  # zipfile drops "..", drive and leading "/" parts
    except zipfile.BadZipFile as e:
        raise DatasetError(f"{archive}: not a valid zip archive ({e}); delete it and run again") from None
    except OSError as e:
        raise DatasetError(f"cannot extract {archive} into {root}: {e.strerror or e}") from None
    parts = ([p for p in m.filename.replace("\\", "/").split("/") if p not in ("", ".", "..")] for m in members)
    tops = dict.fromkeys(p[0] for p in parts if p)  # the top-level names, in order, once each
    logger.info("extracted %s into %s", archive.name, root)
    return list(tops)
