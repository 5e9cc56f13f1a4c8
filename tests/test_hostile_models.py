"""A hostile-model corpus, as tests/test_image_fuzz.py is a hostile-image one: checkpoints, exports
and Hub repositories whose stored configs name commands, URLs and places outside the working folder
in every data key that could reach I/O, sent through `captioner evaluate`, the demo's examples and
`captioner export` (its card and figure); shards that are bombs, huge, misnamed or endless, and a
Hugging Face dataset whose image paths leave its folder, read as the user names them; and every
file of data a model brings (config.json, vocab.json, onnx.json, the scores beside a checkpoint,
its card's YAML) oversized and nested 100,000 deep, read within limits; and links inside a folder
that lead out of it (a model's settings, an image folder's listing, a Hugging Face dataset's
paths), refused, where the user's own links and the Hub cache's are followed.

Each ends in one line (or, where a command can go without the data, in a log line) with nothing
run, nothing read outside the working folder, no connection made, and memory bounded. What the
process starts, opens and connects to is seen by an audit hook (`sys.addaudithook`: every
subprocess, every file opened by Python, every socket connection), beside a marker file that the
`pipe:` commands would create and a loopback HTTP server that counts the requests it is sent;
memory is tracemalloc's peak while a shard is read.
"""

from __future__ import annotations

import bz2
import contextlib
import functools
import gzip
import io
import json
import logging
import lzma
import os
import shutil
import shlex
import sys
import tarfile
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

import pytest
from helpers import TINY_MODEL, fifo_with_a_writer, require_module, serving, tiny_model
from PIL import Image

from captioner.apps.cli import main
from captioner.core.config import config_from_dict, leaf_fields, load_config
from captioner.core.files import sha256_of
from captioner.core.config_sections import Config, DataConfig
from captioner.core.errors import DatasetError, ImageLoadError
from captioner.data.datasets import load_split, split_places
from captioner.data.model_settings import NAMES_NO_PLACE, PLACE_KEYS, SHARD_KEYS
from captioner.data.records import image_data
from captioner.data.shapes import generate_shapes
from captioner.data.shards import write_tar
from captioner.models.checkpoint import model_settings, save_checkpoint

DATASETS = DataConfig.__dataclass_fields__["dataset"].metadata["spec"].options
MiB = 1 << 20

# --- what the process does, seen by an audit hook -------------------------------------------------

STARTS = ("subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn", "os.fork", "os.forkpty",
          "pty.spawn")
CONNECTS = ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "urllib.Request")


@dataclass
class Seen:
    opened: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    connected: list[str] = field(default_factory=list)

    def opened_in(self, folder: Path) -> list[str]:
        base = os.path.abspath(folder)
        return [p for p in self.opened if p == base or p.startswith(base + os.sep)]


WATCHING: list[Seen] = []


def audit(event: str, args: tuple) -> None:
    """Records into the innermost `watched()`; never raises (a hook that raises fails the call it sees)."""
    if not WATCHING:
        return
    try:
        seen = WATCHING[-1]
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            seen.opened.append(os.path.abspath(os.fsdecode(args[0])))
        elif event in STARTS:
            seen.started.append(f"{event} {args[:2]!r}"[:300])
        elif event in CONNECTS:
            seen.connected.append(f"{event} {args!r}"[:300])
    except Exception:  # noqa: BLE001 - an odd argument is not the test's business
        pass


@functools.cache
def hook_once() -> None:
    sys.addaudithook(audit)  # a hook cannot be removed: one per process, idle outside `watched()`


@contextlib.contextmanager
def watched() -> Iterator[Seen]:
    hook_once()
    seen = Seen()
    WATCHING.append(seen)
    try:
        yield seen
    finally:
        WATCHING.pop()


# --- the world: a working folder, data outside it, a marker, a server -------------------------------


class Counting(SimpleHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        Counting.requests.append(self.path)
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:
        pass


def picture(seed: int, size: int = 16) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), (seed * 37 % 256, 90, 160)).save(buffer, format="PNG")
    return buffer.getvalue()


def good_samples(count: int, prefix: str = "") -> list[dict[str, object]]:
    return [{"__key__": f"{prefix}{k:06d}", "png": picture(k), "txt": f"a red square number {k}".encode()}
            for k in range(count)]


def write_index(folder: Path, counts: dict[str, int]) -> None:
    (folder / "shards.json").write_text(
        json.dumps({"wids_version": 1, "shardlist": [{"url": n, "nsamples": c} for n, c in counts.items()]}))


@dataclass
class World:
    work: Path  # the working folder every test here runs in
    outside: Path  # a shapes world, an image folder and shards, outside the working folder
    marker: Path  # what the stored pipe: commands would create
    server: str  # a loopback HTTP server over `outside`, counting its requests


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    require_module("webdataset", "webdataset is not installed (pip install 'captioner[data]')")
    base = tmp_path_factory.mktemp("hostile")
    outside, work = base / "outside", base / "work"
    work.mkdir()
    generate_shapes(outside, 4, 2, 2, image_size=32, seed=0, progress=False)
    for split in ("train", "val", "test"):  # an image folder over the same pictures: metadata beside them
        rows = [{"file_name": p.name, "text": "a shape"} for p in sorted((outside / split).iterdir())]
        (outside / split / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (outside / "shards").mkdir()
    for s in range(2):
        write_tar(outside / "shards" / f"{s:05d}.tar", good_samples(3, f"{s}"))
    write_index(outside / "shards", {"00000.tar": 3, "00001.tar": 3})
    Counting.requests = []
    with serving(functools.partial(Counting, directory=str(outside))) as url:
        yield World(work, outside, base / "ran", url)


@pytest.fixture
def in_work(world: World, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.chdir(world.work)
    return world


def hostile_values(world: World, kind: str, key: str) -> str:
    """What a stranger's config writes in data.<key>, by kind."""
    target = world.outside / "shards" / "{00000..00001}.tar" if key in SHARD_KEYS else world.outside
    return {
        "command": f"pipe:touch {shlex.quote(str(world.marker))} #00000.tar",
        "url": f"{world.server}/shards/{{00000..00001}}.tar" if key in SHARD_KEYS else f"{world.server}/",
        "file-url": f"file://{target}",
        "absolute": str(target),
        "dotdot": os.path.relpath(target, world.work),  # ../outside/...
        "home": "~/.ssh",
    }[kind]


KINDS = ("command", "url", "file-url", "absolute", "dotdot", "home")


TINY = [*TINY_MODEL, "model.decoder.dropout=0.1"]  # tiny_model()'s sections


def hostile_config(world: World, dataset: str, kind: str) -> Config:
    """A config as a stranger stores it: every key that `dataset` reads a place from, and the
    feature store, written as `kind`; the model's own sections a tiny model's."""
    probe = DataConfig(dataset=dataset)
    keys = {key for split in ("train", "val", "test") for key in split_places(probe, split)} | {"feature_store"}
    config = load_config(None, TINY)
    config.data.dataset = dataset
    for key in keys:  # verbatim: an override's value would be read as YAML (where " #" starts a comment)
        setattr(config.data, key, hostile_values(world, kind, key))
    return config_from_dict(config.to_dict(), source=f"a stranger's {dataset} config")  # as it is read back


@dataclass
class Sources:
    checkpoint: Path  # a .pt that is not in the run folder its config names (someone else's)
    export: Path
    hub: str  # a Hub repo id, in a Hugging Face cache laid out as the client lays it out


@pytest.fixture(scope="module")
def hub_cache(world: World) -> Path:
    return world.work.parent / "hub"


def sources(world: World, hub_cache: Path, dataset: str, kind: str) -> Sources:
    name = f"{dataset}-{kind}"
    folder = world.work.parent / "models" / name
    checkpoint = folder / "model.pt"
    if not checkpoint.is_file():
        config = hostile_config(world, dataset, kind)
        model = tiny_model()
        save_checkpoint(checkpoint, model, config)
        model.save_pretrained(folder / "export", training_config=config.to_dict())
        as_stored(folder / "export", config)
        snapshot = hub_cache / f"models--someone--{name}" / "snapshots" / ("0" * 40)
        shutil.copytree(folder / "export", snapshot)
        (snapshot.parents[1] / "refs").mkdir()
        (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    return Sources(checkpoint, folder / "export", f"someone/{name}")


def as_stored(export: Path, config: Config) -> None:
    """The export's config.json with `config` whole, as a stranger's tool writes it (captioner's
    own exports leave the places out: `core/portable_config.py`)."""
    stored = json.loads((export / "config.json").read_text())
    (export / "config.json").write_text(json.dumps({**stored, "training_config": config.to_dict()}))


@pytest.fixture
def offline_hub(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def assert_harmless(seen: Seen, world: World) -> None:
    """Nothing ran, nothing outside was opened, nothing was connected to."""
    assert not world.marker.exists(), "a stored pipe: command ran"
    assert not seen.started, seen.started
    assert not seen.connected, seen.connected
    assert not seen.opened_in(world.outside), seen.opened_in(world.outside)[:5]
    assert not Counting.requests, Counting.requests


# --- 1. settings that travel with a model are data ----------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dataset", DATASETS)
def test_evaluate_refuses_a_models_places_in_one_line_and_runs_reads_and_connects_to_nothing(
    in_work: World, hub_cache: Path, offline_hub: None, dataset: str, kind: str, capsys: pytest.CaptureFixture,
    tmp_path: Path,
) -> None:
    world = in_work
    made = sources(world, hub_cache, dataset, kind)
    split = "test"
    named = [f"data.{k}" for k in split_places(DataConfig(dataset=dataset), split)]
    Counting.requests = []
    for source in (made.checkpoint, made.export, made.hub):
        capsys.readouterr()
        with watched() as seen:
            code = main(["evaluate", str(source), "--split", split, "--fast", "--out", str(tmp_path / "eval")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and err and err[-1].startswith("error: "), err
        line = err[-1]
        assert "is not read where the model's settings say" in line and all(key in line for key in named), line
        assert "Traceback" not in "\n".join(err)
        assert_harmless(seen, world)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dataset", DATASETS)
def test_the_demo_offers_no_example_and_the_export_shows_no_figure_from_a_models_places(
    in_work: World, hub_cache: Path, offline_hub: None, dataset: str, kind: str, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from captioner.apps.demo.cards import model_examples
    from captioner.apps.export import export_model

    world = in_work
    made = sources(world, hub_cache, dataset, kind)
    Counting.requests = []
    with caplog.at_level(logging.WARNING), watched() as seen:
        for source in (made.checkpoint, made.export, made.hub):
            assert model_examples(source) == []
        files = export_model(made.checkpoint, tmp_path / "exported")
    assert_harmless(seen, world)
    # no attention.png
    assert {p.name for p in files} == {"model.safetensors", "config.json", "vocab.json", "README.md"}
    data_line = (tmp_path / "exported" / "README.md").read_text().split("## Training data")[1].strip().splitlines()[0]
    counted = ("4000 training images" if dataset == "shapes" else "its train shards" if dataset == "webdataset"
               else "its train split")
    # counted from the config's numbers, or not at all: nothing was read to count
    assert counted in data_line, data_line
    assert any("not used, as a model's settings are data" in r.getMessage() for r in caplog.records)


def test_the_demo_page_of_a_hostile_export_starts_without_examples(in_work: World, hub_cache: Path) -> None:
    require_module("gradio", "the demo extra is not installed")
    from captioner.apps.demo import build_demo, close

    made = sources(in_work, hub_cache, "imagefolder", "absolute")
    with watched() as seen:
        demo = build_demo([made.export])
    close(demo)
    assert not seen.opened_in(in_work.outside) and not seen.started


def test_a_checkpoint_in_its_own_run_folder_reads_its_local_places_but_never_a_command(
        in_work: World, capsys: pytest.CaptureFixture) -> None:
    """The user's own run, evaluated where it trained: its data root outside the working folder is
    read; its stored shard patterns never are; a copy of it elsewhere is anyone's checkpoint."""
    world = in_work
    run = world.work.parent / "own_run"
    config = load_config(None, [*TINY, f"data.root={world.outside}", f"train.out_dir={run}"])
    config.data.test_shards = f"pipe:touch {shlex.quote(str(world.marker))} #00000.tar"
    save_checkpoint(run / "best.pt", tiny_model(), config)
    settings = model_settings(run)
    assert settings.set_aside == {"data.test_shards": f"pipe:touch {shlex.quote(str(world.marker))} #00000.tar"}
    assert len(settings.load_split("test")) == 2  # the shapes world outside: the user's own
    shutil.copytree(run, world.work / "copied")
    copied = model_settings(world.work / "copied")
    assert set(copied.set_aside) == {"data.root", "data.test_shards"} and copied.config.data.root == "data/shapes"
    with pytest.raises(DatasetError, match=r"copied/best.pt \(config\): the test split is not read .* data.root"):
        copied.load_split("test")
    with watched() as seen:
        assert main(["evaluate", str(world.work / "copied"), "--split", "test", "--fast", "--limit", "1",
                     "--out", "eval",
                     f"data.root={world.outside}"]) == 0  # the user names it: read
    assert seen.opened_in(world.outside) and not world.marker.exists()


def test_the_users_own_command_line_keeps_every_feature(in_work: World, hub_cache: Path, offline_hub: None,
                                                        capsys: pytest.CaptureFixture) -> None:
    """A pipe: the user writes runs: the user's word, not the model's."""
    world = in_work
    made = sources(world, hub_cache, "webdataset", "command")
    shard = world.outside / "shards" / "00000.tar"
    mine = f"data.test_shards=pipe:cat {shlex.quote(str(shard))} #00000.tar"
    assert main(["evaluate", str(made.export), mine, "--split", "test", "--fast", "--out", "eval", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 3
    settings = model_settings(made.checkpoint, [mine])
    assert "data.test_shards" not in settings.set_aside and settings.config.data.test_shards.startswith("pipe:cat ")
    assert "data.val_shards" in settings.set_aside  # the model's own still are not
    assert not world.marker.exists()


def test_every_data_key_that_names_a_place_is_judged() -> None:
    """A text key added to the data section must be sorted into one of model_settings' lists, or a
    stranger's config could name a place through it."""
    text_keys = {dotted.removeprefix("data.") for dotted, _, annotation in leaf_fields()
                 if dotted.startswith("data.") and "str" in str(annotation)}
    assert text_keys == {*SHARD_KEYS, *PLACE_KEYS, *NAMES_NO_PLACE}
    for dataset in DATASETS:  # every dataset says what it reads
        for split in ("train", "val", "test"):
            assert set(split_places(DataConfig(dataset=dataset), split)) <= {*SHARD_KEYS, *PLACE_KEYS}


# --- 2. shards read within limits ---------------------------------------------------------------


def tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def four_samples() -> list[tuple[str, bytes]]:
    return [(f"{k:06d}.{s}", picture(k) if s == "png" else b"a cat") for k in range(4) for s in ("png", "txt")]


def damaged_third_header() -> bytes:
    """Four samples, the third's first header with a wrong checksum: the tar reader stopped there as at an end."""
    data = bytearray(tar_bytes(four_samples()))
    header = data.find(b"000002.png")
    data[header + 148 : header + 156] = b"0000000\0"  # its checksum field
    return bytes(data)


def cut_before_third() -> bytes:
    """Four samples cut short where the third begins (a download that stopped): read as a whole shard of two."""
    data = tar_bytes(four_samples())
    return data[: data.find(b"000002.png")]


class Zeros(io.RawIOBase):
    """`size` zero bytes, made as they are read (a bomb's member, never whole in the test's memory)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def compressed_tar(compress: Callable[[io.BytesIO], io.BufferedIOBase], members: list[tuple[str, int]]) -> bytes:
    """A tar stream of zero-filled members (name, size), through `compress`."""
    raw = io.BytesIO()
    with compress(raw) as stream, tarfile.open(fileobj=stream, mode="w|") as tar:
        for name, size in members:
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BufferedReader(Zeros(size), MiB))
    return raw.getvalue()


def GZIP(raw: io.BytesIO) -> io.BufferedIOBase:  # noqa: N802 - read as the compression's name
    return gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6)


def BZIP2(raw: io.BytesIO) -> io.BufferedIOBase:  # noqa: N802
    return bz2.BZ2File(raw, mode="wb")


def XZ(raw: io.BytesIO) -> io.BufferedIOBase:  # noqa: N802
    return lzma.LZMAFile(raw, mode="wb", preset=0)


def header_bomb(kind: bytes, size: int) -> bytes:
    """A gzip'd tar whose first header is an extended one (pax, or a GNU long name) of `size` bytes:
    a reader that trusts it reads it whole before it reaches a member."""
    info = tarfile.TarInfo("././@PaxHeader" if kind == tarfile.XHDTYPE else "././@LongLink")
    info.type, info.size = kind, size
    raw = io.BytesIO()
    with GZIP(raw) as stream:
        stream.write(info.tobuf(tarfile.USTAR_FORMAT))
        zeros = Zeros(size)
        while chunk := zeros.read(MiB):
            stream.write(chunk)
    return raw.getvalue()


ENDLESS = """# A tar of samples written for ever (asked for shards.json: the index of one shard).
import io, sys, tarfile
if sys.argv[2] == "shards.json":
    print('{"shardlist": [{"url": "00000.tar", "nsamples": 1}]}')
    sys.exit()
tar, k = tarfile.open(fileobj=sys.stdout.buffer, mode="w|"), 0
while True:
    for suffix, data in (("png", b"x" * int(sys.argv[1])), ("txt", b"a cat")):
        info = tarfile.TarInfo(f"{k:09d}.{suffix}")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    k += 1
"""


def endless_command(member_bytes: int) -> Callable[[Path], str]:
    """A pipe: command that never stops writing its shard: the user's own, so it runs."""
    def make(folder: Path) -> str:
        (folder / "endless.py").write_text(ENDLESS)
        return f"pipe:{shlex.join([sys.executable, str(folder / 'endless.py'), str(member_bytes)])} 00000.tar"
    return make


@dataclass(frozen=True)
class ShardCase:
    name: str
    make: Callable[[Path], str]  # writes the shard(s) into a folder; returns the val_shards pattern
    expected: tuple[str, ...]  # what the one line must say
    overrides: tuple[str, ...] = ()
    peak: int = 24 * MiB  # tracemalloc's peak while the split is read may not pass this


def shard_file(build: Callable[[], bytes], count: int = 1) -> Callable[[Path], str]:
    """A shard made when the test runs (not when the module is collected) with its index."""
    def make(folder: Path) -> str:
        (folder / "00000.tar").write_bytes(build())
        write_index(folder, {"00000.tar": count})
        return str(folder / "00000.tar")
    return make


def misnamed(name: str) -> ShardCase:
    build = functools.partial(tar_bytes, [(name, picture(1)), (name.rsplit(".", 1)[0] + ".txt", b"a cat")])
    return ShardCase(f"name {name!r}", shard_file(build), (repr(name), "is not a plain relative name"))


def claiming(size: int) -> bytes:
    """A plain tar whose one header says `size` bytes follow; a few do."""
    info = tarfile.TarInfo("000000.png")
    info.size = size
    return info.tobuf(tarfile.GNU_FORMAT) + picture(1)


SHARD_CASES = [
    ShardCase("gzip bomb: one member of 200 MiB",
              shard_file(functools.partial(compressed_tar, GZIP, [("000000.png", 200 * MiB), ("000000.txt", 3)])),
              ("'000000.png' is 209.7 MB, more than data.max_member_bytes (33.6 MB)",)),
    ShardCase("gzip bomb: 300 members of 1 MiB", shard_file(functools.partial(
        compressed_tar, GZIP, [(f"{k:06d}.{s}", MiB) for k in range(150) for s in ("png", "txt")]), 150),
              ("more than data.max_shard_expansion (20) times",), peak=40 * MiB),
    ShardCase("bzip2 bomb: 60 members of 1 MiB", shard_file(functools.partial(
        compressed_tar, BZIP2, [(f"{k:06d}.{s}", MiB) for k in range(30) for s in ("png", "txt")]), 30),
              ("more than data.max_shard_expansion (20) times",), peak=40 * MiB),
    ShardCase("xz bomb: 60 members of 1 MiB", shard_file(
        functools.partial(compressed_tar, XZ, [(f"{k:06d}.{s}", MiB) for k in range(30) for s in ("png", "txt")]), 30),
              ("more than data.max_shard_expansion (20) times",), peak=40 * MiB),
    ShardCase("a pax header of 200 MiB", shard_file(functools.partial(header_bomb, tarfile.XHDTYPE, 200 * MiB)),
              ("its first header", "over 1.0 MB")),
    ShardCase("a GNU long name of 200 MiB", shard_file(
        functools.partial(header_bomb, tarfile.GNUTYPE_LONGNAME, 200 * MiB)), ("its first header", "over 1.0 MB")),
    ShardCase("a header claiming 64 GiB", shard_file(functools.partial(claiming, 64 << 30)),
              ("'000000.png' is 68.7 GB, more than data.max_member_bytes",)),
    ShardCase("a member over a lowered member limit",
              shard_file(functools.partial(tar_bytes, [("000000.png", bytes(4096)), ("000000.txt", b"a cat")])),
              ("'000000.png' is 4.1 KB, more than data.max_member_bytes (1.0 KB)",), ("data.max_member_bytes=1000",)),
    ShardCase("an endless stream", endless_command(64 << 10),
              ("past data.max_shard_bytes (8.4 MB)",), ("data.max_shard_bytes=8388608",)),
    ShardCase("endless small samples", endless_command(16),
              ("the val split holds more than data.max_split_samples (2,000) samples",),
              ("data.max_split_samples=2000",)),
    ShardCase("a split's images over its bytes",
              shard_file(lambda: tar_bytes([(f"{k:06d}.{s}", os.urandom(MiB) if s == "png" else b"a cat")
                                                                         for k in range(8) for s in ("png", "txt")]),
                                                                         8),
              ("the val split takes more than data.max_split_bytes (4.2 MB) in memory",),
              ("data.max_split_bytes=4194304",)),
    ShardCase("a damaged header between members", shard_file(damaged_third_header, 4),
              ("the header at byte 4,096 is damaged",)),
    ShardCase("a shard cut short between members", shard_file(cut_before_third, 4),
              ("the shard ends at byte 4,096 without tar's end-of-archive blocks",)),
    ShardCase("a duplicate member", shard_file(functools.partial(
        tar_bytes, [("000000.png", picture(1)), ("000000.png", picture(2))])), ("a duplicate member",)),
    *(misnamed(name)
      for name in ("../../etc/000000.png", "/etc/000000.png", "a//000000.png", "./000000.png", "a\\000000.png",
                                   "line\nbreak.png", "x/../000000.png")),
]


@pytest.mark.parametrize("case", SHARD_CASES, ids=lambda c: c.name)
def test_a_hostile_shard_ends_in_one_line_within_its_memory(world: World, tmp_path: Path, case: ShardCase) -> None:
    pattern = case.make(tmp_path)
    config = load_config(
        None, ["data.dataset=webdataset", "data.train_shards=x.tar", f"data.val_shards={pattern}", *case.overrides])
    tracemalloc.start()
    try:
        with pytest.raises(DatasetError) as raised:
            load_split(config.data, "val")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(raised.value)
    assert "\n" not in message and message.startswith(pattern.split(" ", 1)[0] if not pattern.startswith("pipe:")
                                                      else "pipe:"), message
    for fragment in case.expected:
        assert fragment in message, message
    assert peak < case.peak, f"{peak / MiB:.1f} MiB"


def test_a_shard_index_is_read_within_its_limit(world: World, tmp_path: Path) -> None:
    """shards.json too large on disk, over HTTP, and from a command that never stops writing it."""
    big = {"wids_version": 1, "shardlist": [{"url": f"{k:05d}.tar", "nsamples": 1} for k in range(40_000)]}
    (tmp_path / "00000.tar").write_bytes(tar_bytes([("000000.png", picture(1)), ("000000.txt", b"a cat")]))
    (tmp_path / "shards.json").write_text(json.dumps(big))
    served = world.outside / "big_index"
    shutil.copytree(tmp_path, served)
    (tmp_path / "spaces.py").write_text("import sys\nwhile True:\n    sys.stdout.write(' ' * 65536)\n")
    # asked for shards.json too, it writes for ever
    endless = f"pipe:{shlex.join([sys.executable, str(tmp_path / 'spaces.py')])} 00000.tar"
    for pattern in (str(tmp_path / "00000.tar"), f"{world.server}/big_index/00000.tar", endless):
        config = load_config(None, ["data.dataset=webdataset", "data.train_shards=x.tar", f"data.val_shards={pattern}",
                                    "data.max_index_bytes=1000000"])
        with pytest.raises(DatasetError) as raised:
            load_split(config.data, "val")
        assert ("\n" not in str(raised.value)
                and "larger than data.max_index_bytes (1.0 MB)" in str(raised.value)), str(raised.value)
    Counting.requests = []


def test_a_shards_limits_let_ordinary_shards_through(world: World, tmp_path: Path) -> None:
    """The same reader, the same samples as webdataset's: keys, suffixes, captions; gzip'd too."""
    samples = good_samples(5)
    write_tar(tmp_path / "00000.tar", samples)
    (tmp_path / "00001.tar").write_bytes(gzip.compress((tmp_path / "00000.tar").read_bytes()))
    write_index(tmp_path, {"00000.tar": 5, "00001.tar": 5})
    config = load_config(None, ["data.dataset=webdataset", "data.train_shards=x.tar",
                                f"data.val_shards={tmp_path}/{{00000..00001}}.tar"])
    records = load_split(config.data, "val")
    assert [r.path.name for r in records] == [s["__key__"] for s in samples] * 2
    assert records[1].captions == ("a red square number 1",) and image_data(records[6]) == samples[1]["png"]


# --- 3. a Hugging Face dataset's image paths stay in its folder ------------------------------------


def test_hf_image_paths_are_read_inside_the_dataset_folder_only(world: World, tmp_path: Path) -> None:
    require_module("datasets", "the datasets package is not installed (pip install 'captioner[data]')")
    from datasets import Dataset

    folder = tmp_path / "dataset"
    (folder / "images").mkdir(parents=True)
    (folder / "images" / "inside.png").write_bytes(picture(3))
    secret = next((world.outside / "test").glob("*.jpg"))  # the shapes world's
    paths = ["images/inside.png", str(folder / "images" / "inside.png"), str(secret), os.path.relpath(secret, folder),
             "images/../../" + os.path.relpath(secret, tmp_path)]
    Dataset.from_dict({"image": paths, "text": ["a shape"] * len(paths)}).save_to_disk(str(folder))
    config = load_config(None,
                         ["data.dataset=hf", f"data.root={folder}", "data.val_fraction=0", "data.test_fraction=0"])
    records = load_split(config.data, "train")
    outcomes: dict[str, str] = {}
    with watched() as seen:
        for record in records:
            try:
                outcomes[paths[record.row]] = "read" if image_data(record) == picture(3) else "other bytes"
            except ImageLoadError as e:
                assert "\n" not in str(e) and f"row {record.row}" in str(e) and "refused" in str(e), str(e)
                outcomes[paths[record.row]] = "refused"
    assert [outcomes[p] for p in paths] == ["read", "read", "refused", "refused", "refused"]
    assert not seen.opened_in(world.outside)
    # A folder the user names for its images: its absolute paths there are read.
    named = load_config(None, ["data.dataset=hf", f"data.root={folder}", f"data.image_root={world.outside}",
                               "data.val_fraction=0", "data.test_fraction=0"])
    by_row = {r.row: r for r in load_split(named.data, "train")}
    assert image_data(by_row[2]) == secret.read_bytes()
    with pytest.raises(ImageLoadError, match="outside the dataset's folder"):
        image_data(by_row[1])  # the dataset's own folder is no longer the one named


# --- 4. every file of data a model brings is read within limits ------------------------------------


def oversized_json(limit: int) -> str:
    """Valid JSON a mebibyte over `limit`: one long string."""
    return json.dumps("a" * (limit + MiB))


def nested_json(levels: int = 100_000) -> str:
    """Valid JSON nested `levels` deep (about 200 KB for 100,000): the parser recurses once a level."""
    return "[" * levels + "]" * levels


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("limits") / "export"
    tiny_model().save_pretrained(folder, training_config=load_config(None, TINY).to_dict())
    return folder


def hostile_copy(tiny_export: Path, tmp_path: Path, name: str, text: str) -> Path:
    """A copy of the export with `name` replaced by `text`; its checksum recorded as a stranger would."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_export, folder)
    (folder / name).write_text(text, encoding="utf-8")
    if name != "config.json":
        config = json.loads((folder / "config.json").read_text())
        config["files"][name] = {"sha256": sha256_of(folder / name), "bytes": (folder / name).stat().st_size}
        (folder / "config.json").write_text(json.dumps(config))
    return folder


LIMITS = {"oversized": ("16.8 MB", "may take; refused"), "nested": ("32 levels", "may have; refused")}


@pytest.mark.parametrize("name", ["config.json", "vocab.json"])
@pytest.mark.parametrize("kind", list(LIMITS))
def test_an_exports_json_past_a_limit_is_one_line_naming_it_and_the_limit(
    tiny_export: Path, tmp_path: Path, name: str, kind: str, capsys: pytest.CaptureFixture,
) -> None:
    from captioner.core.bounded_files import MODEL_JSON_BYTES

    folder = hostile_copy(tiny_export, tmp_path, name,
                          oversized_json(MODEL_JSON_BYTES) if kind == "oversized" else nested_json())
    Image.new("RGB", (40, 30), (200, 30, 30)).save(tmp_path / "photo.png")
    tracemalloc.start()
    try:
        code = main(["caption", str(folder), str(tmp_path / "photo.png"), "--device", "cpu"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: {folder / name}: ") and all(fragment in err[0]
                                                                  for fragment in LIMITS[kind]), err[0]
    assert peak < 8 * MiB, f"{peak / MiB:.1f} MiB"  # never the whole file, nor a buffer the size of the cap


def test_a_models_json_with_a_number_too_long_to_convert_is_one_line(tmp_path: Path) -> None:
    """json.loads raised int()'s ValueError, naming sys.set_int_max_str_digits, past 4,300 digits."""
    from captioner.core.bounded_files import read_json
    from captioner.core.errors import ExportError

    path = tmp_path / "config.json"
    path.write_text('{"format": "captioner export", "n": ' + "9" * 5000 + "}")
    with pytest.raises(ExportError, match=r"^.*config\.json: not valid JSON here: a number of thousands of digits"):
        read_json(path, "model config", ExportError)


@pytest.mark.parametrize("kind", list(LIMITS))
def test_an_onnx_spec_past_a_limit_is_one_line(tmp_path: Path, kind: str) -> None:
    require_module("onnxruntime", "the ONNX runtime needs onnxruntime (pip install captioner[onnx])")
    from captioner.core.bounded_files import MODEL_JSON_BYTES
    from captioner.core.errors import ExportError
    from captioner.deploy.runtime import load_bundle

    (tmp_path / "onnx.json").write_text(oversized_json(MODEL_JSON_BYTES) if kind == "oversized" else nested_json())
    with pytest.raises(ExportError) as raised:
        load_bundle(tmp_path)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'onnx.json'}: ") and all(f in message
                                                                                             for f in LIMITS[kind])


@pytest.mark.parametrize("kind", list(LIMITS))
def test_scores_beside_a_checkpoint_past_a_limit_are_left_out_in_one_line(tmp_path: Path, kind: str,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    from captioner.apps.export import export_model
    from captioner.core.bounded_files import SCORES_JSON_BYTES
    from captioner.models.model_origin import checkpoint_origin

    save_checkpoint(tmp_path / "run" / "best.pt", tiny_model(), load_config(None, TINY))
    scores = tmp_path / "run" / "scores_test.json"
    scores.write_text(oversized_json(SCORES_JSON_BYTES) if kind == "oversized" else nested_json())
    limit = "33.6 MB" if kind == "oversized" else "32 levels"
    with caplog.at_level(logging.WARNING):
        export_model(tmp_path / "run", tmp_path / "export", image=None)
        origin = checkpoint_origin("run", load_config(None, TINY).to_dict(), tmp_path / "run" / "best.pt")
    warned = [r.getMessage() for r in caplog.records if str(scores) in r.getMessage()]
    assert len(warned) == 2 and all(limit in line and "its scores are left out" in line for line in warned), warned
    assert origin.test_scores == {} and "No scores were recorded" in (tmp_path / "export" / "README.md").read_text()


@pytest.mark.parametrize("reader", ["the model's origin", "the model card"])
def test_scores_beside_a_checkpoint_that_are_a_named_pipe_are_left_out_unopened(
        tmp_path: Path, reader: str, caplog: pytest.LogCaptureFixture) -> None:
    """A pipe named scores_test.json beside someone's checkpoint: `captioner caption` opened it and waited forever
    for a writer (here the helper's writer answers with an empty file, so the old code warned of bad JSON)."""
    from captioner.apps.model_card import read_scores
    from captioner.models.model_origin import checkpoint_origin

    checkpoint = tmp_path / "best.pt"
    save_checkpoint(checkpoint, tiny_model(), load_config(None, TINY))
    with fifo_with_a_writer(tmp_path / "scores_test.json") as fifo, caplog.at_level(logging.WARNING):
        if reader == "the model card":
            assert read_scores(checkpoint, None).test == {}
        else:
            assert checkpoint_origin("run", load_config(None, TINY).to_dict(), checkpoint).test_scores == {}
    assert [r.getMessage() for r in caplog.records] == [
        f"{fifo}: scores file is not a regular file (a pipe, a device or a socket); give a file; "
        "its scores are left out"]


LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    # 81 aliases, 9**9 strings walked
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
CARDS = {  # a card's kind -> (its text, what the line says)
    "oversized": (lambda: "---\nlibrary_name: captioner\n---\n" + "a" * 2 * MiB,
                  ("1.0 MB", "a model card may take; refused")),
    "nested": (lambda: "---\nx: " + nested_json() + "\n---\n",
               ("32 levels", "a model card's metadata may have; refused")),
    "aliases": (lambda: "---\n" + LAUGHS + "---\n", ("20 YAML aliases", "a model card's metadata may hold; refused")),
}


@pytest.mark.parametrize("kind", list(CARDS))
def test_a_card_past_a_limit_is_one_line_and_nothing_is_pushed(
    tiny_export: Path, tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`captioner push` of an exported folder reads its card (to leave out the places its recipe
    names): within limits, as safe YAML, so a card that is huge, deep or an alias bomb stops it in one line."""
    from captioner.apps.export import push_model
    from captioner.core.errors import ExportError

    text, says = CARDS[kind]
    folder = tmp_path / "model"
    shutil.copytree(tiny_export, folder)
    (folder / "README.md").write_text(text(), encoding="utf-8")
    uploaded: list[str] = []

    class RecordingApi:
        def create_repo(self, repo_id: str, private: bool, exist_ok: bool) -> str:
            uploaded.append(repo_id)
            return repo_id

        def upload_folder(self, repo_id: str, folder_path: str, commit_message: str) -> None:
            uploaded.append(folder_path)

    monkeypatch.setattr("huggingface_hub.HfApi", RecordingApi)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: "hf_recorded")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ExportError) as raised:
        push_model(folder, "someone/model")
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{folder / 'README.md'}: ") and all(f in message
                                                                                           for f in says), message
    assert uploaded == []



HUGE_SIZES = {"hidden_dim": ("lstm", {"hidden_dim": 10**12}), "embed_dim": ("lstm", {"embed_dim": 10**12}),
              "d_model": ("transformer", {"d_model": 10**12, "num_heads": 1}),
              "num_layers": ("transformer", {"num_layers": 10**6})}


@pytest.mark.parametrize("key", list(HUGE_SIZES))
@pytest.mark.parametrize("form", ["export", "checkpoint"])
def test_a_model_far_larger_than_its_weights_is_refused_before_it_is_allocated(
        tmp_path: Path, key: str, form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """config.json records no checksum of itself (nor does a checkpoint's spec hold against its maker): a stranger's
    d_model of 10^12 is one line naming the file that says so, not an allocator's traceback or the memory filled.
    The skeleton's margin is cut to this tiny model's size: num_layers=10^6 then stops after a few dozen layers on
    the meta device instead of 1,282 (4 CPU s), the same refusal."""
    from captioner.core.errors import CheckpointError
    from captioner.models import captioner
    from captioner.models.captioner import Captioner

    monkeypatch.setattr(captioner, "SKELETON_MARGIN", 2**16)

    decoder, sizes = HUGE_SIZES[key]
    model = tiny_model(f"model.decoder.type={decoder}")
    if form == "export":
        target = tmp_path / "model"
        model.save_pretrained(target)
        config = json.loads((target / "config.json").read_text())
        config["spec"]["decoder"].update(sizes)
        (target / "config.json").write_text(json.dumps(config))
        named = target / "config.json"
    else:
        target = named = tmp_path / "model.pt"
        save_checkpoint(target, model, spec={**model.spec().to_dict(),
                                             "decoder": {**model.spec().to_dict()["decoder"], **sizes}})
    with pytest.raises(CheckpointError) as raised:
        Captioner.from_pretrained(target, device="cpu")
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{named}: ") and "before allocating" in message, message


TERABYTE = 10**12


def grown(weights: Path) -> None:
    """The export's own weights file, grown past its last tensor to a terabyte: its header as it was."""
    os.truncate(weights, TERABYTE)


def claimed(weights: Path) -> None:
    """A terabyte of weights whose header agrees with its size: one float32 tensor of 250 billion values."""
    header = json.dumps({"decoder.huge": {"dtype": "F32", "shape": [TERABYTE // 4],
                                          "data_offsets": [0, TERABYTE]}}).encode()
    weights.write_bytes(len(header).to_bytes(8, "little") + header)
    os.truncate(weights, 8 + len(header) + TERABYTE)


def headed(weights: Path) -> None:
    """A terabyte whose first 8 bytes claim a header of 2^62 bytes."""
    weights.write_bytes((2**62).to_bytes(8, "little"))
    os.truncate(weights, TERABYTE)


SPARSE = {"grown": (grown, f"{TERABYTE:,} bytes, but its header's tensors end at byte"),
          "claimed": (claimed, "bytes holding 250,000,000,000 weights, far more than the"),
          "header": (headed, "not a readable safetensors file (a header of 4611686.0 TB, more than the 16.8 MB")}


def caption_never_hashing(folder: Path, listed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture) -> tuple[int, list[str]]:
    """`captioner caption` of the export in `folder`, its config.json recording `listed`'s size and a sha256, and
    hashing `listed` an assertion error: the exit code and the lines of stderr."""
    from captioner.core import files

    config = json.loads((folder / "config.json").read_text())
    config["files"][listed.name] = {"sha256": "0" * 64, "bytes": listed.stat().st_size}
    (folder / "config.json").write_text(json.dumps(config))
    hashed = files.sha256_of

    def refuse_the_listed(path: str | Path) -> str:
        assert Path(path) != listed, f"{path} hashed"
        return hashed(path)

    monkeypatch.setattr(files, "sha256_of", refuse_the_listed)
    Image.new("RGB", (40, 30), (200, 30, 30)).save(tmp_path / "photo.png")
    code = main(["caption", str(folder), str(tmp_path / "photo.png"), "--device", "cpu"])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("kind", list(SPARSE))
def test_a_sparse_terabyte_of_weights_is_refused_by_its_size_before_it_is_hashed(
    tiny_export: Path, tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
) -> None:
    """config.json records its weights' size and sha256, but nothing of itself: a stranger's model.safetensors of a
    terabyte (sparse, taking no disk), its size recorded, was hashed in full, a terabyte read, before the model it
    describes was sized. Now its header and the model's weight count refuse it in one line, the hash not begun."""
    build, says = SPARSE[kind]
    folder = tmp_path / "model"
    shutil.copytree(tiny_export, folder)
    weights = folder / "model.safetensors"
    build(weights)
    code, err = caption_never_hashing(folder, weights, tmp_path, monkeypatch, capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: {weights}: ") and says in err[0], err[0]
    assert err[0].endswith("refused before reading it"), err[0]


@pytest.mark.parametrize("name, says", [
    ("vocab.json", "1.1 TB, more than the 16.8 MB a model's vocab.json may take; refused before reading it"),
    ("README.md", "1.1 TB, more than the 1.0 MB a model's README.md may take; refused before reading it"),
    ("notes.bin", None),  # listed, but loading never reads it: sized, not hashed, and the model captions
])
def test_a_sparse_terabyte_of_another_listed_file_is_never_hashed(
    tiny_export: Path, tmp_path: Path, name: str, says: str | None, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """The weights' gap in the files beside them: a vocabulary or card larger than loading reads one within, and a
    file it never reads at all, were hashed in full (a terabyte read) when config.json recorded their size."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_export, folder)
    listed = folder / name
    with listed.open("ab") as f:
        f.truncate(2**40)
    code, err = caption_never_hashing(folder, listed, tmp_path, monkeypatch, capsys)
    if says is None:
        assert code == 0, err
    else:
        assert code == 2 and err == [f"error: {listed}: {says}"], err


def test_a_model_another_thread_builds_meanwhile_is_not_counted_against_the_bound(
        tiny_export: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The weight count's hook is global to the process: a model a demo's or a user's other thread builds while a
    model loads (here, one of 9M weights, past any tiny model's bound) must not make the loading model refused."""
    import threading

    from torch import nn

    from captioner.models import captioner as captioner_module
    from captioner.models.captioner import Captioner

    original = Captioner.from_spec.__func__

    def from_spec_beside_another_build(cls: type, *args: object, **kwargs: object) -> Captioner:
        builder = threading.Thread(target=lambda: nn.Linear(3000, 3000))
        builder.start()
        builder.join()
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(captioner_module.Captioner, "from_spec", classmethod(from_spec_beside_another_build))
    model = Captioner.from_pretrained(tiny_export, device="cpu")
    assert model.spec().vocab


@pytest.mark.parametrize("key, value", [("name", "resnet9000"), ("normalization", "sepia")])
def test_a_backbone_no_registry_knows_is_one_line_naming_the_config(tiny_export: Path, tmp_path: Path, key: str,
                                                                    value: str) -> None:
    """An unknown backbone or pixel statistics in a stranger's config.json was refused naming only the key
    (`model.encoder.name: unknown backbone`), not the file that holds it."""
    from captioner.core.errors import CheckpointError
    from captioner.models.captioner import Captioner

    config = json.loads((tiny_export / "config.json").read_text())
    config["spec"]["encoder"][key] = value
    folder = hostile_copy(tiny_export, tmp_path, "config.json", json.dumps(config))
    with pytest.raises(CheckpointError) as raised:
        Captioner.from_pretrained(folder, device="cpu")
    message = str(raised.value)
    assert message.startswith(f"{folder / 'config.json'}: incompatible config: model.encoder.{key}: "), message


@pytest.mark.parametrize("form", ["export", "checkpoint"])
def test_a_vocabulary_with_a_word_twice_is_one_line_naming_its_file(tiny_export: Path, tmp_path: Path,
                                                                    form: str) -> None:
    """Two ids of one word: "vocabulary has duplicate words", naming no file, came from deep in the model's build;
    now the file that holds the words is named, with the word."""
    from captioner.core.errors import CaptionerError
    from captioner.models.captioner import Captioner

    words = json.loads((tiny_export / "vocab.json").read_text())
    words[-1] = words[5]
    if form == "export":
        target = hostile_copy(tiny_export, tmp_path, "vocab.json", json.dumps(words))
        named = target / "vocab.json"
    else:
        target = named = tmp_path / "model.pt"
        model = tiny_model()
        save_checkpoint(target, model, spec={**model.spec().to_dict(), "vocab": words})
    with pytest.raises(CaptionerError) as raised:
        Captioner.from_pretrained(target, device="cpu")
    assert str(raised.value).startswith(f"{named}") and f"the word {words[5]!r} twice" in str(raised.value)

# --- 5. a link is never a way out of the folder ----------------------------------------------------


def link(path: Path, target: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target, target_is_directory=target.is_dir())
    return path


def strangers_checkpoint(world: World, name: str, *overrides: str) -> Path:
    """A checkpoint someone else trained (not in the run folder its config names)."""
    path = world.work.parent / "models" / name / "model.pt"
    save_checkpoint(path, tiny_model(), load_config(None, [*TINY, *overrides]))
    return path


def test_a_link_in_the_working_folder_is_no_way_out_for_a_models_settings(in_work: World,
                                                                          capsys: pytest.CaptureFixture) -> None:
    """A stranger's model names places inside the working folder that are links out of it, to a
    folder and to a file: refused in one line naming each, nothing read outside. The same link given
    by the user on the command line is followed, as a data.root on a dataset disk is."""
    world = in_work
    link(world.work / "linked_world", world.outside)
    link(world.work / "linked_split.json", world.outside / "captions_test.json")
    (world.work / "images_here").mkdir(exist_ok=True)
    cases = {
        "data.root": strangers_checkpoint(world, "folder-link", "data.root=linked_world"),
        "data.karpathy_file": strangers_checkpoint(world, "file-link", "data.dataset=karpathy",
                                                   "data.karpathy_file=linked_split.json",
                                                   "data.image_root=images_here", "data.root=images_here"),
    }
    for key, checkpoint in cases.items():
        capsys.readouterr()
        with watched() as seen:
            code = main(["evaluate", str(checkpoint), "--split", "test", "--fast", "--out", "eval"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err
        assert (f"{key} 'linked_" in err[0]
                and "a link in the working folder that leads outside it, to" in err[0]), err[0]
        assert not seen.opened_in(world.outside)
    with watched() as seen:  # the user's own word: the link is followed
        assert main(["evaluate", str(cases["data.root"]), "data.root=linked_world", "--split", "test", "--fast",
                     "--limit", "1",
                     "--out", "eval"]) == 0
    assert seen.opened_in(world.work / "linked_world")  # the images outside, read through the link


def test_an_image_folders_listing_cannot_leave_it_through_a_link(world: World, tmp_path: Path) -> None:
    """metadata.jsonl names a link to a file outside, then a file under a link to a folder outside:
    each refused in one line naming the row and the name. The folder itself may be a link (the
    user's data.root): followed."""
    from captioner.data.imagefolder import load_imagefolder

    secret = next((world.outside / "test").glob("*.jpg"))
    folder = tmp_path / "photos"
    folder.mkdir()
    shutil.copyfile(secret, folder / "inside.jpg")
    link(folder / "to_file.jpg", secret)
    link(folder / "to_folder", world.outside / "test")
    for name in ("to_file.jpg", f"to_folder/{secret.name}"):
        rows = [{"file_name": "inside.jpg", "text": "a shape"}, {"file_name": name, "text": "a shape"}]
        (folder / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        with watched() as seen, pytest.raises(DatasetError) as raised:
            load_imagefolder(folder, "train", val_fraction=0, test_fraction=0)
        message = str(raised.value)
        assert "\n" not in message and message.startswith(
            f"{folder / 'metadata.jsonl'}:2: file_name {name!r} is a link out of the image folder")
        assert not seen.opened_in(world.outside)
    (folder / "metadata.jsonl").write_text(json.dumps({"file_name": "inside.jpg", "text": "a shape"}) + "\n")
    records = load_imagefolder(link(tmp_path / "my_photos", folder), "train", val_fraction=0, test_fraction=0)
    assert [r.path.name for r in records] == ["inside.jpg"] and records[0].path.read_bytes() == secret.read_bytes()


def test_hf_image_paths_cannot_leave_the_dataset_through_a_link(world: World, tmp_path: Path) -> None:
    require_module("datasets", "the datasets package is not installed (pip install 'captioner[data]')")
    from datasets import Dataset

    secret = next((world.outside / "test").glob("*.jpg"))
    folder = tmp_path / "dataset"
    (folder / "images").mkdir(parents=True)
    (folder / "images" / "inside.png").write_bytes(picture(3))
    link(folder / "images" / "linked.jpg", secret)
    link(folder / "elsewhere", world.outside / "test")
    root = tmp_path / "my_dataset"  # the user's data.root, a link to the dataset: followed
    paths = ["images/inside.png", "images/linked.jpg", f"elsewhere/{secret.name}", str(root / "images" / "linked.jpg")]
    Dataset.from_dict({"image": paths, "text": ["a shape"] * len(paths)}).save_to_disk(str(folder))
    link(root, folder)
    config = load_config(None, ["data.dataset=hf", f"data.root={root}", "data.val_fraction=0", "data.test_fraction=0"])
    outcomes = {}
    with watched() as seen:
        for record in load_split(config.data, "train"):
            try:
                outcomes[paths[record.row]] = "read" if image_data(record) == picture(3) else "other bytes"
            except ImageLoadError as e:
                assert ("\n" not in str(e) and "is a link out of the dataset's folder" in str(e)
                        and "refused" in str(e)), str(e)
                outcomes[paths[record.row]] = "refused"
    assert [outcomes[p] for p in paths] == ["read", "refused", "refused", "refused"]
    assert not seen.opened_in(world.outside)
    # The folder the user names for its images may be a link too: its files are read.
    named = load_config(None, ["data.dataset=hf", f"data.root={root}",
                               f"data.image_root={link(tmp_path / 'my_images', folder)}",
                               "data.val_fraction=0", "data.test_fraction=0"])
    assert image_data({r.row: r for r in load_split(named.data, "train")}[0]) == picture(3)


def listing(name: str) -> Callable[[Path, Path], None]:
    """A tampering that lists `name` in config.json's files, as a stranger's extra file to check."""

    def tamper(folder: Path, outside: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        config["files"][name.replace("OUTSIDE", str(outside))] = {"sha256": "0" * 64}
        (folder / "config.json").write_text(json.dumps(config))

    return tamper


def linked_out(name: str) -> Callable[[Path, Path], None]:
    """A tampering that moves the export's `name` out of its folder and leaves a link to it in its place."""

    def tamper(folder: Path, outside: Path) -> None:
        shutil.move(folder / name, outside / name)
        link(folder / name, outside / name)

    return tamper


OUT_OF_THE_FOLDER = {"absolute": listing("OUTSIDE/vocab.json"), "dotdot": listing("../outside/vocab.json"),
                     **{f"{name} link": linked_out(name) for name in ("model.safetensors", "vocab.json",
                                                                     "config.json")}}


@pytest.mark.parametrize("case", list(OUT_OF_THE_FOLDER))
def test_an_export_names_no_file_outside_its_folder(tiny_export: Path, tmp_path: Path, case: str,
                                                    capsys: pytest.CaptureFixture) -> None:
    """A file config.json lists, or a file of the export that is a link, leading out of the folder: one line, and
    nothing outside is opened (a stranger's model would read, or learn the checksum of, the user's files)."""
    folder, outside = tmp_path / "model", tmp_path / "outside"
    shutil.copytree(tiny_export, folder)
    outside.mkdir()
    shutil.copyfile(tiny_export / "vocab.json", outside / "vocab.json")
    OUT_OF_THE_FOLDER[case](folder, outside)
    Image.new("RGB", (40, 30), (200, 30, 30)).save(tmp_path / "photo.png")
    with watched() as seen:
        code = main(["caption", str(folder), str(tmp_path / "photo.png"), "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: {folder}"), err
    assert "not a file name inside the model's folder" in err[0] or "a link leading out of" in err[0], err[0]
    assert not seen.opened_in(outside)


def test_a_models_own_files_in_the_hugging_face_cache_are_links_and_load(
    tiny_export: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The Hub client's cache keeps a snapshot's files as links into the repo's blob store: a model
    loads through them, and its settings read quietly."""
    import huggingface_hub.constants as constants

    from captioner.models.captioner import Captioner

    repo = tmp_path / "hub" / "models--someone--linked"
    snapshot = repo / "snapshots" / ("0" * 40)
    for file in tiny_export.iterdir():
        blob = repo / "blobs" / sha256_of(file)
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, blob)
        link(snapshot / file.name, Path("../../blobs") / blob.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    for name, value in (("HF_HUB_CACHE", str(tmp_path / "hub")), ("HF_HUB_OFFLINE", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    assert (snapshot / "config.json").is_symlink()
    with caplog.at_level(logging.WARNING):
        assert len(Captioner.from_pretrained("someone/linked", device="cpu").vocab) > 4
        assert model_settings("someone/linked").set_aside == {}
    assert [r.getMessage() for r in caplog.records] == []
