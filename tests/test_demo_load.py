"""The demo under load: concurrent requests decoded as one batch, a bounded queue that says when
it is full, and temporary files that do not outlive their cleanup period.

The session's tiny trained LSTM (conftest.py `shapes_lstm`, loaded by `shapes_model`) captions the shapes test
images (`shapes_pictures`), each differently, so a caption handed to the wrong request would show; a tiny random
model serves the server tests, where what the caption says does not matter.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import never_stopping, require_module, tiny_model
from PIL import Image

require_module("gradio", "the demo extra is not installed (pip install -e .[demo])")

import httpx  # noqa: E402 (gradio_client's HTTP client)

from captioner.apps.demo.batcher import CaptionBatcher, Job  # noqa: E402
from captioner.apps.demo.server import close, launch  # noqa: E402
from captioner.apps.demo.ui import Callbacks, Cleanup, build_demo  # noqa: E402
from captioner.models.checkpoint import save_checkpoint  # noqa: E402

OPTIONS = {"beam_size": 3, "max_length": 8}
SHORT = 4  # words a server test's captions are cut at: its random model writes to the limit, a heatmap a word


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return never_stopping(tiny_model())


def pictures(count: int, seed: int = 0, size: tuple[int, int] = (40, 48)) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)) for _ in range(count)]


def hold_first_batch(batcher: CaptionBatcher, model, monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event,
                                                                                               threading.Event]:
    """Make the model's first caption call wait until released, so that the requests sent
    meanwhile pile up behind it: (started, release)."""
    started, release = threading.Event(), threading.Event()
    calls = Counter()
    original = model.caption

    def caption(images, **options):
        calls["n"] += 1
        if calls["n"] == 1:
            started.set()
            assert release.wait(60)
        return original(images, **options)

    monkeypatch.setattr(model, "caption", caption)
    return started, release


def ask_all(batcher: CaptionBatcher, model, images: list[Image.Image], options: list[dict], started: threading.Event,
            release: threading.Event) -> list:
    """The first image alone, held; then the others from threads of their own; then release."""
    results: list = [None] * len(images)

    def ask(i: int) -> None:
        try:
            results[i] = batcher.caption(model, images[i], **options[i])
        except Exception as e:  # noqa: BLE001 - the test looks at what each caller got
            results[i] = e

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(images))]
    threads[0].start()
    assert started.wait(60)
    for t in threads[1:]:
        t.start()
    deadline = time.time() + 30
    while len(batcher._pending) < len(images) - 1 and time.time() < deadline:  # all of them waiting
        time.sleep(0.01)
    release.set()
    for t in threads:
        t.join(60)
    return results


def test_requests_that_arrive_together_are_one_batch_with_the_captions_of_single_requests(shapes_model,
                                                                                         shapes_pictures,
                                                                                         monkeypatch) -> None:
    model, images = shapes_model, shapes_pictures[:6]
    alone = [model.caption(image, **OPTIONS) for image in images]
    assert len({c.text for c in alone}) > 2  # different images, different captions: a mix-up would show
    batcher = CaptionBatcher(max_batch=8)
    started, release = hold_first_batch(batcher, model, monkeypatch)
    served = ask_all(batcher, model, images, [OPTIONS] * 6, started, release)
    assert batcher.batch_sizes == Counter({1: 1, 5: 1})  # the held one, then the five that waited, together
    assert [c.text for c in served] == [c.text for c in alone]
    assert [c.score for c in served] == pytest.approx([c.score for c in alone], abs=1e-5)
    for got, want in zip(served, alone):
        assert torch.allclose(got.attn, want.attn, atol=1e-5)  # each its own heatmaps


def test_a_batch_holds_one_set_of_options_and_at_most_max_batch_images(shapes_model, shapes_pictures,
                                                                       monkeypatch) -> None:
    model, images = shapes_model, shapes_pictures[6:12]
    options = [OPTIONS, {**OPTIONS, "beam_size": 2}, OPTIONS, OPTIONS, OPTIONS, {**OPTIONS, "beam_size": 2}]
    alone = [model.caption(image, **o) for image, o in zip(images, options)]
    batcher = CaptionBatcher(max_batch=2)
    started, release = hold_first_batch(batcher, model, monkeypatch)
    served = ask_all(batcher, model, images, options, started, release)
    assert [c.text for c in served] == [c.text for c in alone]
    assert sum(batcher.batch_sizes.values()) == 4 and max(batcher.batch_sizes) == 2  # held; 3 beam-3 as 2 + 1; 2 beam-2


def test_a_caller_behind_more_than_max_batch_of_its_kind_still_gets_its_caption(model) -> None:
    """The decoding thread takes the oldest max_batch jobs of its key, which need not include its
    own (with max_batch=2, the third of three beam-3 callers may wake first): it must go on
    decoding until its own job is served, not return without a caption."""
    images = pictures(3, seed=3)
    batcher = CaptionBatcher(max_batch=2)
    older = [Job(model, image, dict(OPTIONS)) for image in images[:2]]  # waiting before this caller
    batcher._pending.extend(older)
    got = batcher.caption(model, images[2], **OPTIONS)
    assert got.text == model.caption(images[2], **OPTIONS).text
    assert all(job.done and job.result.text == model.caption(job.image, **OPTIONS).text for job in older)
    assert batcher.batch_sizes == Counter({2: 1, 1: 1}) and not batcher._pending


def test_a_failed_batch_fails_each_of_its_requests_and_the_next_batch_runs(model, monkeypatch) -> None:
    batcher = CaptionBatcher()
    images = pictures(3, seed=2)
    monkeypatch.setattr(model, "caption",
                        lambda images, **options: (_ for _ in ()).throw(RuntimeError("decoding broke")))
    with pytest.raises(RuntimeError, match="decoding broke"):
        batcher.caption(model, images[0], **OPTIONS)
    monkeypatch.undo()
    assert batcher.caption(model, images[1], **OPTIONS).text == model.caption(images[1], **OPTIONS).text


# --- through the server --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, model) -> Path:
    path = tmp_path_factory.mktemp("load") / "lstm.pt"
    save_checkpoint(path, model)
    return path


def client(url: str, folder: Path):
    from gradio_client import Client

    return Client(url, verbose=False, analytics_enabled=False, download_files=str(folder))


def test_a_flood_is_told_the_app_is_busy_and_the_queued_requests_are_served(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One caption runs (held), two wait in the queue, and the rest are refused at once with
    Gradio's "queue is full" (the browser shows "This application is currently busy. Please try
    again."); released, the running and the queued ones are answered."""
    from gradio_client import handle_file
    from gradio_client.utils import QueueError

    from captioner.apps.demo import page

    held, release = threading.Event(), threading.Event()
    real = page.caption_page

    def slow_page(*args, **kwargs):
        held.set()
        assert release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr("captioner.apps.demo.ui.caption_page", slow_page)
    demo = build_demo([checkpoint], [], max_batch=1, queue_size=2)
    url = launch(demo, "127.0.0.1", free_port(), block=False)
    try:
        photo = tmp_path / "photo.png"
        pictures(1)[0].save(photo)
        running = client(url, tmp_path / "0").submit(handle_file(str(photo)), max_length=SHORT, api_name="/caption")
        assert held.wait(60)
        queued = [client(url, tmp_path / str(i)).submit(handle_file(str(photo)), max_length=SHORT, api_name="/caption")
                  for i in (1, 2)]
        deadline = time.time() + 30
        while len(demo._queue) < 2 and time.time() < deadline:
            time.sleep(0.05)
        refused = 0
        for i in range(3, 6):
            with pytest.raises(QueueError, match="[Qq]ueue is full"):
                client(url, tmp_path / str(i)).predict(handle_file(str(photo)), api_name="/caption")
            refused += 1
        release.set()
        texts = [job.result(timeout=120)[0] for job in [running, *queued]]
        assert refused == 3 and len(set(texts)) == 1 and texts[0]
    finally:
        release.set()
        close(demo)


def count_files(folder: Path) -> tuple[int, int]:
    """(files, folders) under `folder`."""
    files = folders = 0
    for _, dirs, names in os.walk(folder):
        files += len(names)
        folders += len(dirs)
    return files, folders


def test_temporary_files_stay_bounded_over_a_compressed_day(checkpoint: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A day of requests with the cleanup shrunk from hourly to seconds: files older than
    max_age_s go (uploads, heatmaps, figures), and so do the folders Gradio leaves empty, so the
    cache holds the last few seconds' files, not all of them. Requests come at a steady pace (a
    quarter of the cleanup age apart at most), so what the cache holds is bounded by time."""
    from gradio_client import handle_file

    cache = tmp_path / "cache"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(cache))  # this server's alone, as `captioner demo` makes it
    # An age well above a request's latency beside another pytest worker, so files live until the
    # client fetches them (too short, and a heatmap is deleted before its download: a 403).
    cleanup = Cleanup(every_s=0.5, max_age_s=2, empty_folders=True)
    pace = cleanup.max_age_s / 4  # seconds between requests' starts, at least
    demo = build_demo([checkpoint], [], cleanup=cleanup)
    url = launch(demo, "127.0.0.1", free_port(), block=False)
    photos = tmp_path / "photos"
    photos.mkdir()
    try:
        api = client(url, tmp_path / "downloads")
        counts, requests, text = [], 0, ""
        started = time.time()
        while requests < 12 or time.time() - started < 3 * cleanup.max_age_s:  # three cleanup ages at least
            time.sleep(max(0.0, started + requests * pace - time.time()))
            photo = photos / f"photo_{requests}.png"
            pictures(1, seed=requests)[0].save(photo)  # each upload a file of its own
            # Files younger than max_age_s are never deleted: a request's files can be gone before the
            # client fetches them only when the machine was so loaded that the request outlived that age
            # (seen with a training run and a second test suite beside this one).
            asked = time.time()
            try:
                text, _, gallery, _ = api.predict(handle_file(str(photo)), max_length=SHORT, api_name="/caption")
            except httpx.HTTPStatusError as e:
                assert e.response.status_code == 403 and time.time() - asked > cleanup.max_age_s - cleanup.every_s, e
                requests += 1
                continue
            assert text and len(gallery) == len(text.split())
            asked = time.time()
            figure = api.predict(api_name="/figure")
            assert figure or time.time() - asked > cleanup.max_age_s - cleanup.every_s, (
                "a fresh figure was deleted before its download")
            requests += 1
            counts.append(count_files(cache))
        assert text, "every request outlived the cleanup age: too loaded a machine to check anything"
        per_request = len(text.split()) + 2  # heatmaps, the figure, the upload
        assert max(files for files, _ in counts) < 0.7 * requests * per_request  # files were deleted along the way
        time.sleep(cleanup.max_age_s + 3 * cleanup.every_s)
        assert count_files(cache)[0] <= 1  # all gone but what Gradio keeps for the page
        # A request's prune finds the emptied folders; the next one, an interval later, deletes them.
        for _ in range(2):
            asked = time.time()
            try:
                api.predict(handle_file(str(photos / "photo_0.png")), max_length=SHORT, api_name="/caption")
            except httpx.HTTPStatusError as e:  # as in the loop: only a request that outlived the cleanup age
                assert e.response.status_code == 403 and time.time() - asked > cleanup.max_age_s - cleanup.every_s, e
            time.sleep(2 * cleanup.every_s)
        files, folders = count_files(cache)
        assert folders <= 6 and files <= 2 * per_request + 1  # the two requests' own files, in their folders
    finally:
        close(demo)


def test_callbacks_write_their_pictures_inside_gradios_cache(checkpoint: Path, model, tmp_path: Path,
                                                             monkeypatch) -> None:
    """So that Gradio serves each heatmap where it is, instead of hashing and copying it: one file
    per picture, deleted on Gradio's schedule."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "cache"))
    callbacks = Callbacks({str(checkpoint): model})
    photo = tmp_path / "photo.png"
    pictures(1)[0].save(photo)
    _, _, gallery, _, result = callbacks.caption(str(photo), str(checkpoint), 3, 8, "1", "mean")
    assert gallery and all(Path(path).parent == callbacks.out_dir for path, _ in gallery)
    assert callbacks.out_dir.parent == tmp_path / "cache"
    assert Path(callbacks.figure(result, "1", "mean")).parent == callbacks.out_dir


def test_a_request_s_prune_deletes_old_figures_and_heatmaps_and_keeps_fresh_ones(checkpoint: Path, model,
                                                                                   tmp_path: Path, monkeypatch) -> None:
    """What the callbacks write is what `prune` looks for, by name: files older than the age go, younger stay."""
    from captioner.apps.demo.page import prune

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "cache"))
    callbacks = Callbacks({str(checkpoint): model})
    photo = tmp_path / "photo.png"
    pictures(1)[0].save(photo)
    written = []
    for _ in range(2):
        _, _, gallery, _, result = callbacks.caption(str(photo), str(checkpoint), 3, 8, "1", "mean")
        written.append([Path(path) for path, _ in gallery] + [Path(callbacks.figure(result, "1", "mean"))])
    old, fresh = written
    for path in old:
        os.utime(path, (time.time() - 100, time.time() - 100))
    prune(callbacks.out_dir, max_age_s=50)
    assert not any(path.exists() for path in old) and all(path.is_file() for path in fresh)
    assert sorted(callbacks.out_dir.iterdir()) == sorted(fresh)


def test_each_process_that_serves_a_page_gets_a_gradio_cache_of_its_own(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    """Gradio deletes what a closing server cached, by content-named path: a cache shared with
    another process loses that process's copies of the same pictures (test_demo's closing test)."""
    from captioner.apps.demo.ui import OWNER, private_cache

    monkeypatch.delenv("GRADIO_TEMP_DIR", raising=False)
    monkeypatch.delenv(OWNER, raising=False)
    first = private_cache()
    assert first is not None and first.is_dir() and os.environ["GRADIO_TEMP_DIR"] == str(first)
    assert private_cache() is None  # this process has its own already
    monkeypatch.setenv(OWNER, f"1 {first}")  # what a child inherits from the process that started it
    second = private_cache()
    assert second is not None and second != first and os.environ["GRADIO_TEMP_DIR"] == str(second)
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))  # the user's choice stands, inherited or not
    monkeypatch.setenv(OWNER, f"1 {second}")
    assert private_cache() is None and os.environ["GRADIO_TEMP_DIR"] == str(tmp_path)


def test_an_empty_folder_goes_at_the_second_prune_that_finds_it_empty_whatever_its_time(tmp_path: Path) -> None:
    """Gradio's deletions renew a folder's modification time; what is deleted does not depend on it."""
    from captioner.apps.demo.page import prune_folders

    keep, emptied, holding = (tmp_path / name for name in ("page", "emptied", "holding"))
    for folder in (keep, emptied, holding):
        folder.mkdir()
    (holding / "upload.png").write_bytes(b"x")
    seen = prune_folders(tmp_path, keep, set())
    assert seen == {emptied} and emptied.is_dir()  # first look: it may be a folder about to get its file
    os.utime(emptied)  # a deletion inside it just now
    assert prune_folders(tmp_path, keep, seen) == set()
    assert not emptied.exists() and holding.is_dir() and keep.is_dir()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    seen = prune_folders(tmp_path, keep, set())
    (fresh / "answer.jpg").write_bytes(b"x")  # its file arrived between the two looks
    prune_folders(tmp_path, keep, seen)
    assert (fresh / "answer.jpg").is_file()


def test_a_cache_sweep_that_races_with_requests_does_not_end_gradios_cleanup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gradio's sweep iterates sets that requests add to: its RuntimeError used to end the schedule for good
    (uploads then piled up). Wrapped, a racing round is tried again, and one that keeps racing is skipped."""
    from gradio import route_utils

    from captioner.apps.demo import ui

    calls: list[int] = []

    def racing(blocks: object, age: int) -> None:
        calls.append(age)
        if len(calls) in (1, 3, 4, 5):  # the first sweep races once, the second three times
            raise RuntimeError("Set changed size during iteration")

    monkeypatch.setattr(route_utils, "delete_files_created_by_app", racing)
    ui.keep_cache_cleanup_alive()
    route_utils.delete_files_created_by_app(None, 2)  # raced once, then swept
    assert calls == [2, 2]
    route_utils.delete_files_created_by_app(None, 2)  # raced three times: skipped, not raised
    assert calls == [2, 2, 2, 2, 2]
    ui.keep_cache_cleanup_alive()  # wrapped once only
    assert route_utils.delete_files_created_by_app.__wrapped__ is racing


def test_the_load_benchmark_tells_the_servers_own_cpu_from_its_childrens() -> None:
    """`demo_load` splits the server's CPU time between its own process (the web server) and its decoding child:
    a child's seconds count in the tree's total and not in the process's own."""
    import subprocess
    import sys

    from benchmarks.bench_demo_load import cpu_seconds

    burn = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
            "print('burnt', flush=True)\ntime.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "burnt"
        own, tree = cpu_seconds(os.getpid(), descendants=False), cpu_seconds(os.getpid())
        assert own is not None and tree is not None and tree - own >= 0.25  # the burn (0.3 s), in ticks
    finally:
        child.kill()
        child.wait()


REPORT = {"captions_per_s": 9.104, "requests": 288, "p50": 0.452, "p95": 0.634, "max": 1.21, "cpu_per_caption": 0.1534,
          "server_cpu_per_caption": 0.1027, "rss_start": 1363.0, "rss_peak": 1571.4, "rss_end": 1500.0, "wrong": 0}


@pytest.mark.parametrize("wrong", [0, 2])
def test_the_load_benchmark_writes_its_run_as_a_record_only_when_its_captions_hold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, wrong: int) -> None:
    """--record ID: the report under bench_demo_load.json's columns, the packaged model by its path in the
    repository; a run whose served captions differ from local ones writes nothing and fails."""
    import json
    import shutil

    from benchmarks import bench_demo_load, records
    from helpers import REPO, render_results

    shutil.copy(REPO / "docs" / "results" / "bench_demo_load.json", tmp_path)
    before = (tmp_path / "bench_demo_load.json").read_bytes()
    (tmp_path / "photos").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "photos" / "a.jpg")
    monkeypatch.setattr(bench_demo_load, "PHOTOS", tmp_path / "photos")
    monkeypatch.setattr(bench_demo_load, "expected_captions", lambda checkpoint, photos, args: {})
    monkeypatch.setattr(bench_demo_load, "served_run", lambda checkpoint, photos, args: {**REPORT, "wrong": wrong})
    monkeypatch.setattr(records, "commit", lambda: "abc1234")
    packaged = REPO / "captioner" / "pretrained" / "flickr8k_transformer_scst"
    argv = [str(packaged), "--clients", "6", "--beside", "nothing", "--record", "a_test"]
    assert bench_demo_load.main(argv, results=tmp_path) == (1 if wrong else 0)
    out = capsys.readouterr().out
    if wrong:
        assert "record a_test not written: 2 served captions differ" in out
        assert (tmp_path / "bench_demo_load.json").read_bytes() == before
        return
    data = json.loads((tmp_path / "bench_demo_load.json").read_text(encoding="utf-8"))
    record = data["records"][-1]
    assert record["numbers"] == {"p50": "0.45", "p95": "0.63", "rate": "9.10", "cpu": "0.153 (0.103 / 0.051)",
                                 "rss": "1.36 GB -> 1.57 GB peak (PSS, the server and its children)"}
    assert record["command"].endswith("python -m benchmarks demo_load captioner/pretrained/flickr8k_transformer_scst "
                                      "--clients 6 --beside nothing --record a_test")
    assert record["note"] == "288 requests; the slowest caption 1.21 s" and record["commit"] == "abc1234"
    columns = {column["key"] for column in data["columns"]}
    assert render_results().record_problems("a_test", record, columns) == []


def test_a_load_record_keeps_the_makers_paths_and_ports_out(tmp_path: Path) -> None:
    from benchmarks.bench_demo_load import PATHS, recorded_argv
    from benchmarks.records import command_line

    mine = tmp_path / "model"
    assert recorded_argv(["--clients", "2", str(mine)], mine) == ["--clients", "2", "CHECKPOINT"]
    command = command_line("demo_load", recorded_argv(["--url", "http://127.0.0.1:7861", "--pid", "4242"], None), PATHS)
    assert command.endswith("python -m benchmarks demo_load --url URL --pid PID")
