"""Tests for the COCO and Flickr8k downloaders against a local HTTP server on 127.0.0.1 (never the internet)."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import re
import shutil
import socket
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

import pytest
from helpers import held_elsewhere, released_once_said, serving

from captioner.apps.cli import main
from captioner.core.errors import DatasetError
from captioner.data import download
from captioner.data.download import RemoteFile, download_coco, download_file, download_flickr8k
from captioner.data.flickr8k import load_flickr8k


@dataclass
class ServerState:
    files: dict[str, bytes] = field(default_factory=dict)  # URL path -> body
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)
    cut_after: dict[str, int] = field(default_factory=dict)  # path -> bytes sent before a cut
    ignore_range: bool = False
    fail_with: dict[str, int] = field(default_factory=dict)  # path -> HTTP status to answer
    base: str = ""

    def requests_for(self, path: str) -> list[str | None]:
        return [rng for p, rng in self.requests if p == path]


def _handler(state: ServerState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep pytest output clean
            pass

        def do_GET(self) -> None:
            rng = self.headers.get("Range")
            state.requests.append((self.path, rng))
            data = state.files.get(self.path)
            if self.path in state.fail_with:
                self.send_error(state.fail_with[self.path])
                return
            if data is None:
                self.send_error(404, "Not Found")
                return
            start = 0
            if rng and not state.ignore_range:
                start = int(re.fullmatch(r"bytes=(\d+)-", rng)[1])
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            cut = state.cut_after.pop(self.path, None)  # only the first request is cut
            self.wfile.write(body if cut is None else body[:cut])
            self.wfile.flush()
            if cut is not None:
                self.close_connection = True

    return Handler


@pytest.fixture
def server():
    state = ServerState()
    with serving(_handler(state)) as state.base:
        yield state


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(download, "RETRY_BACKOFF_S", 0.0)


def _zip(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:  # stored: size ~ payload size
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


CAPTIONS = {
    "images": [{"id": 42, "file_name": "COCO_val2014_000000000042.jpg"}],
    "annotations": [{"id": 1, "image_id": 42, "caption": "A dog on a couch."}],
}
TRAIN_IMAGE = os.urandom(30_000)
VAL_IMAGE = os.urandom(40_000)
ARCHIVES = {
    "/zips/train2014.zip": _zip({"train2014/COCO_train2014_000000000009.jpg": TRAIN_IMAGE}),
    "/zips/val2014.zip": _zip({
        "val2014/COCO_val2014_000000000042.jpg": VAL_IMAGE,
        "val2014/COCO_val2014_000000000073.jpg": os.urandom(1000),
    }),
    "/annotations/annotations_trainval2014.zip": _zip({
        "annotations/captions_val2014.json": json.dumps(CAPTIONS).encode(),
        "annotations/captions_train2014.json": b'{"images": [], "annotations": []}',
    }),
    "/people/karpathy/deepimagesent/caption_datasets.zip": _zip({
        "dataset_coco.json": b'{"images": []}',
        "dataset_flickr8k.json": b'{"images": []}',
    }),
}
GROUPS = {"train2014.zip": "2014", "val2014.zip": "2014", "annotations_trainval2014.zip": "2014",
          "caption_datasets.zip": "karpathy"}


@pytest.fixture
def coco(server, monkeypatch) -> ServerState:
    """Serve fake archives and point the file table (official URLs) at them with their sizes/md5s."""
    server.files.update(ARCHIVES)
    table = []
    for path, data in ARCHIVES.items():
        name = path.rsplit("/", 1)[1]
        host = "https://cs.stanford.edu" if "karpathy" in path else "http://images.cocodataset.org"
        table.append(RemoteFile(name, host + path, len(data), _md5(data), GROUPS[name]))
    monkeypatch.setattr(download, "COCO_FILES", tuple(table))
    return server


def test_download_coco_downloads_and_extracts(coco, tmp_path):
    paths = download_coco(tmp_path, "2014", mirror=coco.base, progress=True)

    assert paths == [tmp_path / "train2014", tmp_path / "val2014", tmp_path / "annotations"]
    assert json.loads((tmp_path / "annotations/captions_val2014.json").read_text()) == CAPTIONS
    assert (tmp_path / "train2014/COCO_train2014_000000000009.jpg").read_bytes() == TRAIN_IMAGE
    assert (tmp_path / "val2014/COCO_val2014_000000000042.jpg").read_bytes() == VAL_IMAGE
    for path, data in ARCHIVES.items():
        if "karpathy" not in path:
            assert (tmp_path / "downloads" / path.rsplit("/", 1)[1]).read_bytes() == data
    assert not list(tmp_path.rglob("*.part"))
    assert not (tmp_path / "dataset_coco.json").exists()  # karpathy=False: not fetched
    assert all(p.startswith(("/zips/", "/annotations/")) for p, _ in coco.requests)


def test_karpathy_archive_is_fetched_when_asked(coco, tmp_path):
    paths = download_coco(tmp_path, "2014", karpathy=True, mirror=coco.base + "/", progress=False)

    assert paths[-2:] == [tmp_path / "dataset_coco.json", tmp_path / "dataset_flickr8k.json"]
    assert (tmp_path / "dataset_coco.json").read_bytes() == b'{"images": []}'
    assert coco.requests_for("/people/karpathy/deepimagesent/caption_datasets.zip") == [None]


def test_second_call_downloads_and_extracts_nothing(coco, tmp_path):
    first = download_coco(tmp_path, "2014", mirror=coco.base, progress=False)
    assert len(coco.requests) == 3
    image = tmp_path / "val2014/COCO_val2014_000000000042.jpg"
    image.write_bytes(b"edited")  # a re-extraction would overwrite this

    second = download_coco(tmp_path, "2014", mirror=coco.base, progress=False)

    assert second == first
    assert len(coco.requests) == 3
    assert image.read_bytes() == b"edited"


def test_a_second_download_into_a_folder_being_filled_waits_and_fetches_nothing(coco, tmp_path, caplog):
    """Before, two downloads into one root at once (a `data` command run twice, two first runs) each fetched every
    archive, appending to the same .part files. Now the second waits, saying so, then finds them extracted."""
    other = tmp_path / "other"
    download_coco(other, "2014", mirror=coco.base, progress=False)
    assert len(coco.requests) == 3
    root = tmp_path / "root"
    (root / "downloads").mkdir(parents=True)
    said = f"waiting for another process, which is downloading into {root}"
    caplog.set_level("INFO", logger="captioner.data.download")
    finished = functools.partial(shutil.copytree, other, root, dirs_exist_ok=True)  # what the other one made
    with held_elsewhere("download", root / "downloads", finished) as release:
        watcher = released_once_said(caplog, said, release)
        paths = download_coco(root, "2014", mirror=coco.base, progress=False)
        watcher.join()
    assert said in caplog.messages
    assert paths == [root / "train2014", root / "val2014", root / "annotations"]
    assert len(coco.requests) == 3


def test_second_call_after_archives_deleted_still_skips(coco, tmp_path):
    download_coco(tmp_path, "2014", mirror=coco.base, progress=False)
    for archive in (tmp_path / "downloads").glob("*.zip"):  # users delete the 20 GB of zips
        archive.unlink()
    download_coco(tmp_path, "2014", mirror=coco.base, progress=False)
    assert len(coco.requests) == 3


def test_resume_after_interrupted_transfer(server, tmp_path):
    data = ARCHIVES["/zips/val2014.zip"]
    server.files["/f.zip"] = data
    server.cut_after["/f.zip"] = 15_000
    dest = tmp_path / "f.zip"

    result = download_file(f"{server.base}/f.zip", dest, len(data), _md5(data), progress=False)

    assert result == dest
    assert server.requests_for("/f.zip") == [None, "bytes=15000-"]
    assert dest.read_bytes() == data
    assert not dest.with_suffix(".zip.part").exists()


def test_resume_from_part_file_left_by_earlier_run(server, tmp_path):
    data = ARCHIVES["/zips/train2014.zip"]
    server.files["/f.zip"] = data
    dest = tmp_path / "f.zip"
    dest.with_suffix(".zip.part").write_bytes(data[:10_000])

    download_file(f"{server.base}/f.zip", dest, len(data), _md5(data), progress=False)

    assert server.requests_for("/f.zip") == ["bytes=10000-"]
    assert dest.read_bytes() == data


def test_complete_part_file_without_known_size(server, tmp_path):
    data = ARCHIVES["/zips/train2014.zip"]
    server.files["/f.zip"] = data
    dest = tmp_path / "f.zip"
    dest.with_suffix(".zip.part").write_bytes(data)  # crashed between download and rename

    download_file(f"{server.base}/f.zip", dest, progress=False)  # server answers 416

    assert server.requests_for("/f.zip") == [f"bytes={len(data)}-"]  # not fetched again
    assert dest.read_bytes() == data


def test_server_ignoring_range_restarts_from_zero(server, tmp_path):
    data = ARCHIVES["/zips/val2014.zip"]
    server.files["/f.zip"] = data
    server.cut_after["/f.zip"] = 15_000
    server.ignore_range = True
    dest = tmp_path / "f.zip"

    # No size or md5: only the restart logic keeps the prefix from being written twice.
    download_file(f"{server.base}/f.zip", dest, progress=False)

    assert server.requests_for("/f.zip") == [None, "bytes=15000-"]
    assert dest.read_bytes() == data


def test_checksum_mismatch_raises_and_leaves_no_file(server, tmp_path):
    data = ARCHIVES["/zips/val2014.zip"]
    server.files["/f.zip"] = data
    dest = tmp_path / "f.zip"
    wrong = "0" * 32

    with pytest.raises(DatasetError) as excinfo:
        download_file(f"{server.base}/f.zip", dest, len(data), wrong, progress=False)

    message = str(excinfo.value)
    assert "f.zip" in message and wrong in message and _md5(data) in message
    assert "\n" not in message
    assert not dest.exists() and not dest.with_suffix(".zip.part").exists()


def test_existing_file_with_wrong_content_is_replaced(server, tmp_path):
    data = ARCHIVES["/zips/train2014.zip"]
    server.files["/f.zip"] = data
    dest = tmp_path / "f.zip"
    dest.write_bytes(b"x" * len(data))  # right size, wrong content

    download_file(f"{server.base}/f.zip", dest, len(data), _md5(data), progress=False)
    assert dest.read_bytes() == data
    download_file(f"{server.base}/f.zip", dest, len(data), _md5(data), progress=False)
    assert len(server.requests) == 1  # the verified file is kept the second time


def test_server_size_differs_from_table(server, tmp_path):
    server.files["/f.zip"] = b"abc"
    with pytest.raises(DatasetError, match="server reports 3 bytes, expected 4"):
        download_file(f"{server.base}/f.zip", tmp_path / "f.zip", 4, progress=False)
    assert not (tmp_path / "f.zip").exists()


def test_404_names_the_url(server, tmp_path):
    url = f"{server.base}/zips/missing.zip"
    with pytest.raises(DatasetError, match=re.escape(url) + ".*404"):
        download_file(url, tmp_path / "missing.zip", progress=False)
    assert len(server.requests) == 1  # a 404 is not retried
    assert not (tmp_path / "missing.zip").exists()


def test_404_through_download_coco(coco, tmp_path):
    del coco.files["/zips/val2014.zip"]
    with pytest.raises(DatasetError, match=re.escape(f"{coco.base}/zips/val2014.zip")):
        download_coco(tmp_path, "2014", mirror=coco.base, progress=False)


def test_server_error_is_retried_then_reported(server, tmp_path):
    server.fail_with["/f.zip"] = 503
    url = f"{server.base}/f.zip"
    with pytest.raises(DatasetError, match=re.escape(url) + ": HTTP 503"):
        download_file(url, tmp_path / "f.zip", progress=False)
    assert len(server.requests) == download.MAX_ATTEMPTS


def test_unreachable_host(tmp_path):
    with socket.socket() as sock:  # find a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/zips/val2014.zip"

    with pytest.raises(DatasetError, match=f"cannot reach 127.0.0.1:{port}") as excinfo:
        download_file(url, tmp_path / "val2014.zip", progress=False)
    assert url in str(excinfo.value)
    assert not (tmp_path / "val2014.zip").exists()


def test_bad_year_and_bad_mirror(tmp_path):
    with pytest.raises(DatasetError, match="2015"):
        download_coco(tmp_path, "2015")
    with pytest.raises(DatasetError, match="mirror"):
        download_coco(tmp_path, "2014", mirror="not a url")


def test_official_table_is_consistent():
    names = [f.name for f in download.COCO_FILES]
    assert len(names) == len(set(names))
    for year in download.YEARS:
        assert {f.name for f in download.COCO_FILES if f.group == year} == {
            f"train{year}.zip", f"val{year}.zip", f"annotations_trainval{year}.zip"}
    for f in download.COCO_FILES:
        assert f.url.endswith("/" + f.name) and f.size > 0
        assert f.md5 is None or re.fullmatch(r"[0-9a-f]{32}", f.md5)


# Flickr8k: the two archives as the real ones are laid out (the text files at the top of
# Flickr8k_text.zip; the photos in Flicker8k_Dataset/, sic, beside a __MACOSX/ tree of resource
# forks in Flickr8k_Dataset.zip), with three photos, one per split.
FLICKR8K_PATH = "/jbrownlee/Datasets/releases/download/Flickr8k/"
PHOTOS = {f"{n}_abc.jpg": os.urandom(20_000 + n) for n in (1, 2, 3)}
TOKENS = "".join(f"{name}#{k}\tA dog runs number {k} .\n" for name in PHOTOS for k in range(5))
FLICKR8K_ARCHIVES = {
    FLICKR8K_PATH + "Flickr8k_text.zip": _zip({
        "Flickr8k.token.txt": TOKENS.encode(),
        "Flickr_8k.trainImages.txt": b"1_abc.jpg\n",
        "Flickr_8k.devImages.txt": b"2_abc.jpg\n",
        "Flickr_8k.testImages.txt": b"3_abc.jpg\n",
        "readme.txt": b"Flickr8k",
    }),
    FLICKR8K_PATH + "Flickr8k_Dataset.zip": _zip({
        **{f"Flicker8k_Dataset/{name}": data for name, data in PHOTOS.items()},
        **{f"__MACOSX/Flicker8k_Dataset/._{name}": b"\0\5\26\7" for name in PHOTOS},
    }),
}


@pytest.fixture
def flickr8k(server, monkeypatch) -> ServerState:
    """Serve the fake archives; the table keeps the official URLs and (unknown) sizes, with the
    fakes' MD5s."""
    server.files.update(FLICKR8K_ARCHIVES)
    table = tuple(RemoteFile(f.name, f.url, f.size, _md5(FLICKR8K_ARCHIVES[FLICKR8K_PATH + f.name]), f.group)
                  for f in download.FLICKR8K_FILES)
    monkeypatch.setattr(download, "FLICKR8K_FILES", table)
    return server


def test_download_flickr8k_unpacks_a_root_that_load_flickr8k_reads(flickr8k, tmp_path):
    paths = download_flickr8k(tmp_path, mirror=flickr8k.base, progress=False)

    assert [r for r, _ in flickr8k.requests] == [FLICKR8K_PATH + "Flickr8k_text.zip",  # small one first
                                                 FLICKR8K_PATH + "Flickr8k_Dataset.zip"]
    assert tmp_path / "Flickr8k.token.txt" in paths and tmp_path / "Flicker8k_Dataset" in paths
    assert not (tmp_path / "__MACOSX").exists() and tmp_path / "__MACOSX" not in paths
    assert not (tmp_path / "images").exists()  # the archive's folder, not renamed
    for split, name in (("train", "1_abc.jpg"), ("val", "2_abc.jpg"), ("test", "3_abc.jpg")):
        records = load_flickr8k(tmp_path, split, strict=True)  # no data.image_root needed
        assert [r.path for r in records] == [tmp_path / "Flicker8k_Dataset" / name]
        assert records[0].captions == tuple(f"A dog runs number {k} ." for k in range(5))
        assert records[0].path.read_bytes() == PHOTOS[name]
    assert not list(tmp_path.rglob("*.part"))


def test_flickr8k_command_says_what_it_fetched_and_the_config_line(flickr8k, tmp_path, capsys):
    root = tmp_path / "flickr8k"
    assert main(["data", "flickr8k", "--root", str(root), "--mirror", flickr8k.base]) == 0
    out = capsys.readouterr().out
    assert f"Flickr8k ready under {root}: Flickr8k_text.zip, Flickr8k_Dataset.zip" in out
    assert f"3 photos in {root / 'Flicker8k_Dataset'}" in out
    assert "train 1, val 1, test 1 images with captions" in out
    assert f"use it with: data.root={root} " in out

    assert main(["data", "flickr8k", "--root", str(root), "--mirror", flickr8k.base]) == 0
    assert len(flickr8k.requests) == 2  # the second run fetches nothing
    assert "train 1, val 1, test 1" in capsys.readouterr().out


def test_flickr8k_resumes_an_interrupted_download(flickr8k, tmp_path):
    photos = FLICKR8K_PATH + "Flickr8k_Dataset.zip"
    flickr8k.cut_after[photos] = 25_000

    download_flickr8k(tmp_path, mirror=flickr8k.base, progress=False)

    assert flickr8k.requests_for(photos) == [None, "bytes=25000-"]
    assert (tmp_path / "downloads" / "Flickr8k_Dataset.zip").read_bytes() == FLICKR8K_ARCHIVES[photos]
    assert [r.path.name for r in load_flickr8k(tmp_path, "train", strict=True)] == ["1_abc.jpg"]


def test_flickr8k_resumes_a_part_file_left_by_a_killed_run(flickr8k, tmp_path):
    photos = FLICKR8K_PATH + "Flickr8k_Dataset.zip"
    (tmp_path / "downloads").mkdir()
    (tmp_path / "downloads" / "Flickr8k_Dataset.zip.part").write_bytes(FLICKR8K_ARCHIVES[photos][:30_000])

    download_flickr8k(tmp_path, mirror=flickr8k.base, progress=False)

    assert flickr8k.requests_for(photos) == ["bytes=30000-"]
    assert len(load_flickr8k(tmp_path, "test", strict=True)) == 1


def test_flickr8k_checksum_mismatch_is_one_line_naming_the_file(flickr8k, monkeypatch, tmp_path, capsys):
    text, photos = download.FLICKR8K_FILES
    monkeypatch.setattr(download, "FLICKR8K_FILES",
                        (text, RemoteFile(photos.name, photos.url, None, "0" * 32, photos.group)))

    assert main(["data", "flickr8k", "--root", str(tmp_path), "--mirror", flickr8k.base]) == 2

    err = capsys.readouterr().err  # progress bars too, each redrawn after a carriage return
    errors = [line for line in err.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "Traceback" not in err
    assert errors[0].startswith("error: Flickr8k_Dataset.zip: checksum mismatch (expected md5 " + "0" * 32)
    assert not list((tmp_path / "downloads").glob("Flickr8k_Dataset.zip*"))  # nothing corrupt kept
    assert not (tmp_path / "Flicker8k_Dataset").exists()


@pytest.mark.parametrize("bad", ["a file", "under a file"])
def test_flickr8k_bad_root_is_one_line(flickr8k, tmp_path, capsys, bad):
    (tmp_path / "taken").write_text("not a folder")
    root = tmp_path / "taken" if bad == "a file" else tmp_path / "taken" / "flickr8k"

    assert main(["data", "flickr8k", "--root", str(root), "--mirror", flickr8k.base]) == 2

    err = capsys.readouterr().err
    expected = ": a file, not a folder" if bad == "a file" else "cannot create the folder"
    assert err.startswith("error: ") and expected in err and str(root) in err and err.count("\n") == 1
    assert flickr8k.requests == []  # refused before any download


def test_flickr8k_archives_without_the_expected_files(flickr8k, monkeypatch, tmp_path):
    """A mirror serving other archives under these names: named, not a loader error later."""
    other = _zip({"notes.txt": b"x"})
    flickr8k.files[FLICKR8K_PATH + "Flickr8k_text.zip"] = other
    text, photos = download.FLICKR8K_FILES
    monkeypatch.setattr(download, "FLICKR8K_FILES",
                        (RemoteFile(text.name, text.url, None, _md5(other), text.group), photos))

    with pytest.raises(DatasetError,
                       match=r"did not unpack Flickr8k\.token\.txt, Flickr_8k\.trainImages\.txt, .*downloads$"):
        download_flickr8k(tmp_path, mirror=flickr8k.base, progress=False)


def test_loader_prefers_images_to_the_archive_folder(tmp_path):
    (tmp_path / "Flickr8k.token.txt").write_text("a.jpg#0\tA dog .\n")
    (tmp_path / "Flickr_8k.trainImages.txt").write_text("a.jpg\n")
    for folder in ("Flicker8k_Dataset", "images"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.jpg").write_bytes(b"jpeg")
        assert load_flickr8k(tmp_path, "train")[0].path == tmp_path / folder / "a.jpg"
    assert load_flickr8k(tmp_path, "train",
                         image_root=tmp_path / "Flicker8k_Dataset")[0].path.parent.name == "Flicker8k_Dataset"


def test_official_flickr8k_table():
    assert [f.name for f in download.FLICKR8K_FILES] == ["Flickr8k_text.zip", "Flickr8k_Dataset.zip"]
    for f in download.FLICKR8K_FILES:
        assert f.url == "https://github.com/jbrownlee/Datasets/releases/download/Flickr8k/" + f.name
        assert f.size is None and re.fullmatch(r"[0-9a-f]{32}", f.md5) and f.group == "flickr8k"
