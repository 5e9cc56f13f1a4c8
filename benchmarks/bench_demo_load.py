"""The demo under load: many clients at once, real photos with broken files mixed in. Serves
CHECKPOINT (or measures --url) to --clients gradio sessions fetching heatmaps as a browser does and
asking for the downloadable figure and (a transformer) the head view and per-head maps after each caption, at once,
as the page does; broken uploads must get their one-line message and the served captions match local ones. It sets the
demo's defaults (`--max-batch 8`, `--queue-size 32`, the malloc arena cap). `--record ID` writes the run as record
ID of docs/results/bench_demo_load.json, with its command, commit, processor and date."""

from __future__ import annotations

import argparse
import functools
import io
import os
import shutil
import signal
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from captioner.apps.arguments import decode_value, nonnegative_int, positive_int
from captioner.core.config_sections import thread_count

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.records import (  # noqa: E402
    REPOSITORY,
    RESULTS,
    add_record_options,
    check_record_option,
    command_line,
    record_run,
)
from benchmarks.shared_data import FLICKR8K_PHOTOS  # noqa: E402
from benchmarks.timing import argument_parser, json_option, print_environment, print_json, run_main  # noqa: E402

PHOTOS = FLICKR8K_PHOTOS
REFUSED = "**Could not caption this file.**"


# --- the inputs ----------------------------------------------------------------------------------


def broken_files(folder: Path, photo: Path) -> list[tuple[str, Path, str]]:
    """(kind, file, what its one-line message must say): files a user might upload by mistake."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    truncated = folder / "truncated.jpg"
    truncated.write_bytes(photo.read_bytes()[:2000])
    text = folder / "notes.jpg"
    text.write_text("not a picture, only a name ending in .jpg\n")
    empty = folder / "empty.png"
    empty.write_bytes(b"")
    buffer = io.BytesIO()
    Image.new("L", (1, 1)).save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    data[16:24] = struct.pack(">II", 8000, 8000)  # IHDR width, height: a decompression bomb's header
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    bomb = folder / "bomb.png"
    bomb.write_bytes(bytes(data))
    return [
        ("truncated JPEG", truncated, "truncated.jpg: corrupt or truncated"),
        ("text named .jpg", text, "notes.jpg: not an image file"),
        ("empty file", empty, "empty.png: empty file"),
        ("64-megapixel PNG", bomb, "bomb.png: image is 8000x8000"),
    ]


# --- the server ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(checkpoint: Path, options: list[str], temp: Path, threads: int | None = None,
                 timeout: float = 300.0) -> tuple[subprocess.Popen, str, Path]:
    """`captioner -v demo CHECKPOINT OPTIONS` on a free local port with its temporary files in `temp`, on
    `threads` torch threads (default: its own choice), once it answers -> (the server, its URL, its log file)."""
    port = free_port()
    env = {**os.environ, "TMPDIR": str(temp)}
    if threads is not None:
        env["CAPTIONER_THREADS"] = str(threads)
    env.pop("GRADIO_TEMP_DIR", None)  # the demo makes its own cache, inside TMPDIR
    example = PHOTOS / "1001773457_577c3a7d70.jpg"
    command = [sys.executable, "-m", "captioner.apps.cli", "-v", "demo", str(Path(checkpoint).resolve()),
               "--port", str(port), "--examples", str(example), *options]
    log = Path(tempfile.mkstemp(prefix="bench-demo-server-", suffix=".log")[1])  # outside `temp`: not one of its files
    with log.open("w") as output:  # the server's log, never a pipe that could fill and stall it
        # SIGINT back to its default in the server (a shell may have it ignored): Ctrl-C stops both
        restore_interrupt = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
        server = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT,
                                  preexec_fn=restore_interrupt)
    url = f"http://127.0.0.1:{port}/"
    wait_until_served(server, url, timeout, log)
    return server, url, log


def wait_until_served(server: subprocess.Popen, url: str, timeout: float, log: Path | None = None) -> None:
    """Return once the demo answers at `url`; stop with its exit code (and its log's end) if it
    exits first, or stop it when it stays silent for `timeout` seconds."""
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the demo exited with code {server.returncode}"
                             + (f": {log.read_text()[-2000:]}" if log else ""))
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.5)
    server.terminate()
    raise SystemExit(f"the demo did not answer on {url} within {timeout:.0f} s")


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (Linux /proc): the server and its decoding process."""
    found, waiting = [], [pid]
    while waiting:
        current = waiting.pop()
        found.append(current)
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                waiting += [int(child) for child in children.read_text().split()]
            except (OSError, ValueError):  # a thread or child that ended meanwhile
                pass
    return found


def resident_mb(pid: int) -> float | None:
    """The memory in MB of the process and its descendants (Linux /proc): their proportional set sizes, which
    count a library page they share once, else their resident sizes; None when it is gone."""
    total = None
    for member in process_tree(pid):
        for name, field_ in ((f"/proc/{member}/smaps_rollup", "Pss:"), (f"/proc/{member}/status", "VmRSS:")):
            try:
                lines = Path(name).read_text().splitlines()
            except OSError:
                continue
            kb = next((int(line.split()[1]) for line in lines if line.startswith(field_)), None)
            if kb is not None:
                total = (total or 0.0) + kb / 1024
                break
    return total


def cpu_seconds(pid: int, descendants: bool = True) -> float | None:
    """The user + system CPU time so far of the process and its descendants (Linux /proc), or of the process
    alone; None when it is gone."""
    total = None
    for member in process_tree(pid) if descendants else [pid]:
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
            total = (total or 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            continue
    return total


def temp_files(folder: Path | None) -> tuple[int, int, float]:
    """(files, folders, MB) under `folder`."""
    if folder is None:
        return 0, 0, 0.0
    files = folders = size = 0
    for root, dirs, names in os.walk(folder):
        folders += len(dirs)
        for name in names:
            try:
                size += os.lstat(os.path.join(root, name)).st_size
                files += 1
            except OSError:
                pass
    return files, folders, size / 1e6


@dataclass
class Watch:
    """The server's memory and temporary files, sampled every `every` seconds in a thread."""

    pid: int | None
    temp: Path | None
    every: float = 0.5
    rss: list[float] = field(default_factory=list)
    files: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        if self.pid is not None and (mb := resident_mb(self.pid)) is not None:
            self.rss.append(mb)
        if self.temp is not None:
            self.files.append(temp_files(self.temp)[0])

    def run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self) -> Watch:
        self.sample()
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


# --- the clients ---------------------------------------------------------------------------------


@dataclass
class Answer:
    kind: str  # "caption", or the broken file's kind
    outcome: str  # "captioned", "refused as expected", or what went wrong
    seconds: float
    text: str = ""
    photo: str = ""


def fetch_heatmaps(gallery: list[dict], session) -> bool:
    """Download the answer's heatmaps as a browser does, over one kept-alive connection."""
    pictures = [session.get(item["image"]["url"]) for item in gallery]
    return all(r.status_code == 200 and r.content[:2] == b"\xff\xd8" for r in pictures)  # JPEGs


def views_step(client) -> tuple[int, str] | None:
    """(index, the layer menu's first value) of the page's step after a caption that draws the transformer views (its
    outputs hold the head view), made callable: gradio_client refuses a page's private steps, which a browser calls
    by index through the same queue. None when the page has none."""
    props = {c["id"]: c.get("props", {}) for c in client.config["components"]}
    layer = next((p.get("value") for p in props.values() if p.get("elem_id") == "layer"), None)
    for index, dependency in enumerate(client.config["dependencies"]):
        if any(props.get(output, {}).get("elem_id") == "head_view" for output in dependency["outputs"]):
            index = dependency.get("id", index)
            client.endpoints[index].is_valid = True
            return index, layer
    return None


def ask_views(client, step: tuple[int, str]):
    """Ask the page's views step for the head view and the per-head maps of the kept caption (the layer menu's value,
    the mean of the heads, the first word, as the page starts) -> its job."""
    index, layer = step
    return client.submit(layer, "mean", None, fn_index=index)


def views_fetched(answer: tuple, session) -> bool:
    """Whether the views step answered both pictures (head view, per-head maps, word menu), fetched as a browser
    does. An LSTM's answer hides them: nothing to fetch."""
    updates = [update for update in answer[:2] if isinstance(update, dict) and "visible" in update]
    if len(updates) != 2:  # a drawing that failed skips its outputs
        return False
    fetched = [session.get(update["value"]["url"]) for update in updates if update["visible"]]
    return all(r.status_code == 200 and r.content[:2] == b"\xff\xd8" for r in fetched)  # JPEGs


def views_drawn(client, step: tuple[int, str], session) -> bool:
    """The views step alone, asked and fetched."""
    return views_fetched(ask_views(client, step).result(), session)


def after_caption(client, figure: bool, views: tuple[int, str] | None, session, in_turn: bool = False) -> str:
    """The page's steps after a caption, asked at once as a browser does (both follow /caption), or `in_turn`: the
    downloadable figure (/figure, which a browser fetches only when the button is clicked) and, for a transformer,
    the views. '' when each answered, else what failed."""
    drawing = client.submit(api_name="/figure") if figure else None
    if in_turn and drawing is not None:
        drawing.result()
    viewing = ask_views(client, views) if views else None
    if drawing is not None and not drawing.result():
        return "bad answer: no figure"
    if viewing is not None and not views_fetched(viewing.result(), session):
        return "bad answer: no transformer views"
    return ""


def outcome(kind: str, expected: str, answer: tuple, session) -> tuple[str, str]:
    """How one /caption answer went: (outcome, caption text)."""
    text, _, gallery, note = answer
    if kind == "caption":
        words = text.split()
        good = bool(words) and len(gallery) == len(words) and fetch_heatmaps(gallery, session)
        return ("captioned" if good else f"bad answer: {note[:80] or 'no heatmaps'}"), text
    if note.startswith(REFUSED) and expected in note and "\n" not in note.strip():
        return "refused with its one-line message", text
    return f"wrong message: {note[:80]!r}", text


@functools.cache
def shared_tls() -> ssl.SSLContext:
    """One TLS context for every client request (read-only once made: the threads can share it)."""
    return ssl.create_default_context()


def client_tls(args: argparse.Namespace) -> ssl.SSLContext | bool:
    """What a client's requests verify TLS with: one context shared by them all, as a browser keeps one.
    gradio_client makes an httpx client per request, and each loads the CA bundle afresh (~23 ms of CPU, three or
    four times a caption) on the server's cores; `--tls-per-request` keeps that cost, as earlier records had it."""
    return True if args.tls_per_request else shared_tls()


def client_run(
    url: str, index: int, photos: list[Path], broken: list[tuple[str, Path, str]], args: argparse.Namespace,
    gate: threading.Barrier, answers: list[Answer],
) -> None:
    import httpx
    from gradio_client import Client, handle_file

    tls = client_tls(args)
    client = Client(url, verbose=False, analytics_enabled=False, download_files=False, ssl_verify=tls)
    session = httpx.Client(timeout=120, verify=tls)
    options = {k: v for k, v in (("beam_size", args.beam), ("max_length", args.max_length)) if v is not None}
    views = views_step(client) if args.views else None
    gate.wait()
    for r in range(args.requests):
        number = index * args.requests + r
        if args.broken_every and r % args.broken_every == args.broken_every - 1:
            kind, path, expected = broken[(number // args.broken_every) % len(broken)]
        else:
            kind, path, expected = "caption", photos[number % len(photos)], ""
        started = time.perf_counter()
        try:
            answer = client.predict(handle_file(str(path)), **options, api_name="/caption")
            result, text = outcome(kind, expected, answer, session)
            seconds = time.perf_counter() - started  # the caption's latency: upload to heatmaps downloaded
            if result == "captioned" and (args.figure or views):
                result = after_caption(client, args.figure, views, session, args.in_turn) or result
        except Exception as e:  # noqa: BLE001 - counted by kind in the report
            busy = "queue is full" in str(e).lower()
            answers.append(Answer(kind, "busy: queue full" if busy else f"error: {type(e).__name__}",
                                  time.perf_counter() - started))
            continue
        answers.append(Answer(kind, result, seconds, text, path.name))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def load_run(url: str, pid: int | None, temp: Path | None, photos: list[Path], args: argparse.Namespace,
             label: str) -> dict:
    """Warm the server up, run the clients, print the report; returns its numbers."""
    import httpx
    from gradio_client import Client, handle_file

    from captioner.core.errors import first_line

    # the broken files and the clients' downloads, gone when the run ends however it ends
    with tempfile.TemporaryDirectory(prefix="bench-demo-load-", ignore_cleanup_errors=True) as folder:
        work = Path(folder)
        broken = broken_files(work / "broken", photos[0])
        try:
            warm = Client(url, verbose=False, analytics_enabled=False, download_files=str(work / "warm"),
                          ssl_verify=client_tls(args))
        except (httpx.HTTPError, ValueError) as e:  # nothing there, or no gradio app: a mistaken --url, in one line
            raise SystemExit(f"{url}: no demo answers there ({first_line(e)})") from None
        for photo in photos[:2]:
            warm.predict(handle_file(str(photo)), api_name="/caption")
        return clients_run(url, pid, temp, photos, broken, args, label)


def clients_run(url: str, pid: int | None, temp: Path | None, photos: list[Path], broken: list[tuple[str, Path, str]],
                args: argparse.Namespace, label: str) -> dict:
    """The clients at once against the warmed server, then the report: its numbers."""
    answers: list[Answer] = []
    gate = threading.Barrier(args.clients + 1)
    threads = [
        threading.Thread(target=client_run, args=(url, i, photos, broken, args, gate, answers))
        for i in range(args.clients)
    ]
    for t in threads:
        t.start()
    with Watch(pid, temp) as watch:
        gate.wait()
        started, own_before = time.perf_counter(), time.process_time()
        cpu_before, server_before = (cpu_seconds(pid), cpu_seconds(pid, False)) if pid else (None, None)
        for t in threads:
            t.join()
        total = time.perf_counter() - started
        own_cpu = time.process_time() - own_before
        cpu_after, server_after = (cpu_seconds(pid), cpu_seconds(pid, False)) if pid else (None, None)
    captions = [a for a in answers if a.kind == "caption" and a.outcome == "captioned"]
    latencies = [a.seconds for a in answers if a.kind == "caption" and not a.outcome.startswith("busy")]
    outcomes = Counter((a.kind, a.outcome) for a in answers)
    print(f"\n== {label}: {args.clients} clients x {args.requests} requests ({len(answers)} requests), {total:.1f} s")
    for (kind, result), count in sorted(outcomes.items()):
        print(f"  {kind:<18} {result:<40} {count}")
    report = {"captions_per_s": len(captions) / total, "requests": len(answers)}
    if latencies:
        report |= {"p50": percentile(latencies, 0.5), "p95": percentile(latencies, 0.95), "max": max(latencies)}
        print(
            f"  caption latency (upload to heatmaps downloaded): p50 {report['p50']:.2f} s, "
            f"p95 {report['p95']:.2f} s, max {report['max']:.2f} s, mean {statistics.mean(latencies):.2f} s"
        )
    refusals = [a.seconds for a in answers if a.kind != "caption" and a.outcome.startswith("refused")]
    if refusals:
        print(f"  broken files answered in: median {statistics.median(refusals):.2f} s, max {max(refusals):.2f} s")
    print(f"  throughput: {report['captions_per_s']:.2f} captions/s ({len(captions)} captions with their heatmaps"
          f"{' and figures' if args.figure else ''}{' and transformer views' if args.views else ''})")
    if cpu_before is not None and cpu_after is not None and captions:
        report["cpu_per_caption"] = (cpu_after - cpu_before) / len(captions)
        print(f"  CPU time per caption (robust to other load): server and its children "
              f"{report['cpu_per_caption']:.3f} s, these clients {own_cpu / len(captions):.3f} s")
        if server_before is not None and server_after is not None:  # the web server's own share, beside the model's
            report["server_cpu_per_caption"] = (server_after - server_before) / len(captions)
            print(f"    of which the server's own process (web requests, events, files, pictures) "
                  f"{report['server_cpu_per_caption']:.3f} s, its decoding process and any other child "
                  f"{report['cpu_per_caption'] - report['server_cpu_per_caption']:.3f} s")
    if watch.rss:
        report |= {"rss_start": watch.rss[0], "rss_peak": max(watch.rss), "rss_end": watch.rss[-1]}
        quarters = " / ".join(f"{watch.rss[round(q * (len(watch.rss) - 1))]:.0f}" for q in (0.25, 0.5, 0.75))
        print(f"  server and its children, memory (PSS): start {watch.rss[0]:.0f} MB, at 1/4, 1/2, 3/4 of the run "
              f"{quarters} MB, end {watch.rss[-1]:.0f} MB, peak {max(watch.rss):.0f} MB")
    if temp is not None:
        print(f"  server temporary files: start {watch.files[0]}, peak {max(watch.files)}, end {watch.files[-1]} "
              f"({temp_files(temp)[1]} folders, {temp_files(temp)[2]:.1f} MB)")
    report["wrong"] = wrong_captions(answers, args)
    return report


def expected_captions(checkpoint: Path, photos: list[Path], args: argparse.Namespace) -> dict[str, str]:
    """The first --check photos captioned here one at a time, as the CLI would: photo name -> text. The model is
    loaded even for none: a CHECKPOINT that is not a model is one line (CaptionerError) before a server starts."""
    import torch

    from captioner.data.image_files import load_image
    from captioner.models.checkpoint import load_captioner

    torch.set_num_threads(1)
    model = load_captioner(checkpoint)
    if not args.check:
        return {}
    defaults = {"beam_size": min(model.decode_config.beam_size, 10),
                "max_length": min(model.decode_config.max_length, 60)}
    options = {**defaults,
               **{k: v for k, v in (("beam_size", args.beam), ("max_length", args.max_length)) if v is not None}}
    return {p.name: model.caption(load_image(p), **options).text for p in photos[: args.check]}


def wrong_captions(answers: list[Answer], args: argparse.Namespace) -> int:
    expected = args.expected
    checked = [a for a in answers if a.photo in expected and a.outcome == "captioned"]
    wrong = [a for a in checked if a.text != expected[a.photo]]
    if expected:
        print(f"  served captions equal to single-image captions made here: "
              f"{len(checked) - len(wrong)}/{len(checked)}")
        for a in wrong[:3]:
            print(f"    {a.photo}: served {a.text!r}, expected {expected[a.photo]!r}")
    return len(wrong)


def served_run(checkpoint: Path, photos: list[Path], args: argparse.Namespace) -> dict:
    """Start a server, load it, stop it."""
    temp = Path(tempfile.mkdtemp(prefix="bench-demo-server-"))
    server, url, log = start_server(checkpoint, ["--max-batch", str(args.max_batch), "--queue-size",
                                                 str(args.queue_size)], temp, args.server_threads)
    chosen = [line.split("torch threads for captions: ")[1] for line in log.read_text().splitlines()
              if "torch threads for captions: " in line]
    print(f"server's torch threads: {chosen[-1] if chosen else 'not said'}")
    try:
        return load_run(url, server.pid, temp, photos, args,
                        f"--max-batch {args.max_batch}, --queue-size {args.queue_size}")
    finally:
        server.send_signal(signal.SIGINT)  # as Ctrl-C: the server stops cleanly and logs its batch sizes
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        sizes = [line.split("caption batches by size: ")[1] for line in log.read_text().splitlines()
                 if "caption batches by size: " in line]
        if sizes:
            print(f"  caption batches by size (size: batches): {sizes[-1]}")
        shutil.rmtree(temp, ignore_errors=True)  # the server's uploads and pictures, counted above
        log.unlink(missing_ok=True)


PATHS = {"--url": "URL", "--pid": "PID"}  # the options whose value is the maker's: written so in a record


def recorded_argv(argv: list[str], checkpoint: Path | None) -> list[str]:
    """The arguments as a record keeps them: a checkpoint inside the repository (the packaged model) by its path
    there, any other as CHECKPOINT."""
    if checkpoint is None:
        return list(argv)
    try:
        word = checkpoint.resolve().relative_to(REPOSITORY).as_posix()
    except ValueError:
        word = "CHECKPOINT"
    given = next(i for i, arg in enumerate(argv) if not arg.startswith("-") and Path(arg) == checkpoint)
    return [*argv[:given], word, *argv[given + 1:]]


def megabytes(mb: float) -> str:
    """'778 MB', '1.36 GB', as the records write a server's memory."""
    return f"{mb / 1000:.2f} GB" if mb >= 1000 else f"{mb:.0f} MB"


def record_numbers(report: dict) -> dict[str, str]:
    """A run's report (as --json prints it) under bench_demo_load.json's columns."""
    cells = {"rate": f"{report['captions_per_s']:.2f}"}
    if "p50" in report:
        cells |= {"p50": f"{report['p50']:.2f}", "p95": f"{report['p95']:.2f}"}
    if "cpu_per_caption" in report:
        cells["cpu"] = f"{report['cpu_per_caption']:.3f}"
        if "server_cpu_per_caption" in report:  # the server's own process / its decoding child
            own = report["server_cpu_per_caption"]
            cells["cpu"] += f" ({own:.3f} / {report['cpu_per_caption'] - own:.3f})"
    if "rss_start" in report:
        cells["rss"] = (f"{megabytes(report['rss_start'])} -> {megabytes(report['rss_peak'])} peak "
                        "(PSS, the server and its children)")
    return {key: cells[key] for key in ("p50", "p95", "rate", "cpu", "rss") if key in cells}


def demo_url(text: str) -> str:
    """argparse type of --url: an http(s) address with a host, refused in one line before any client starts."""
    from urllib.parse import urlsplit

    address = urlsplit(text.strip())
    if address.scheme not in ("http", "https") or not address.hostname:
        raise argparse.ArgumentTypeError(f"{text!r}: expected the demo's address, e.g. http://127.0.0.1:7860/")
    return text.strip()


def main(argv: list[str] | None = None, results: Path = RESULTS) -> int:
    parser = argument_parser("demo_load", __doc__)
    parser.add_argument("checkpoint", type=Path, nargs="?", help="served with `captioner demo` (or give --url)")
    parser.add_argument("--url", type=demo_url, help="a demo already running, instead of starting one")
    parser.add_argument("--pid", type=positive_int, help="with --url: the server's process id, for its memory")
    parser.add_argument("--clients", type=positive_int, default=6)
    parser.add_argument("--requests", type=positive_int, default=48, help="requests per client, one after another")
    parser.add_argument("--broken-every", type=nonnegative_int, default=8,
                        help="every N-th request of a client sends a broken file (0: none)")
    parser.add_argument("--beam", type=decode_value("beam_size"), help="default: the page's (the model's config)")
    parser.add_argument("--max-length", type=decode_value("max_length"),
                        help="default: the page's (the model's config)")
    parser.add_argument("--max-batch", type=positive_int, default=8, help="the server's --max-batch")
    parser.add_argument("--queue-size", type=positive_int, default=32, help="the server's --queue-size")
    parser.add_argument("--server-threads", type=thread_count, metavar="N",
                        help="the server's torch threads ($CAPTIONER_THREADS; default: the demo's own choice)")
    parser.add_argument("--check", type=nonnegative_int, default=12,
                        help="photos captioned here first, to compare with the served captions")
    parser.add_argument("--tls-per-request", action="store_true",
                        help="clients load a TLS context for every request, as gradio_client does by default")
    parser.add_argument("--no-figure", dest="figure", action="store_false",
                        help="ask /caption alone, not the figure the page asks for after it (records before the "
                             "figure step was timed)")
    parser.add_argument("--in-turn", action="store_true",
                        help="ask the figure, then the views, one after the other (records before they were asked at "
                             "once, as a browser does)")
    parser.add_argument("--no-views", dest="views", action="store_false",
                        help="skip the transformer views (head view, per-head maps) the page asks for after a caption "
                             "(records before that step was timed)")
    parser.add_argument("--photos", type=positive_int, default=200,
                        help="distinct Flickr8k photos the clients cycle through")
    add_record_options(parser, "bench_demo_load", "the run")
    json_option(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if (args.checkpoint is None) == (args.url is None):
        parser.error("give a CHECKPOINT to serve, or --url of a running demo")
    if args.pid is not None and args.url is None:
        parser.error("--pid applies only with --url (a server this run starts is measured by its own id)")
    check_record_option(parser, args, "bench_demo_load", results)

    photos = sorted(PHOTOS.glob("*.jpg"))[: args.photos]
    if not photos:
        raise SystemExit(f"no photos in {PHOTOS}")
    print_environment(args)
    print(f"photos from {PHOTOS}")
    args.expected = expected_captions(args.checkpoint, photos, args) if args.checkpoint else {}
    if args.url:
        report = load_run(args.url, args.pid, None, photos, args, f"the demo at {args.url}")
    else:
        report = served_run(args.checkpoint, photos, args)
    if args.record and report["wrong"]:
        print(f"\nrecord {args.record} not written: {report['wrong']} served captions differ from the ones made here",
              flush=True)
    elif args.record:
        command = command_line("demo_load", recorded_argv(argv, args.checkpoint), PATHS)
        slowest = f"; the slowest caption {report['max']:.2f} s" if "max" in report else ""
        record_run("bench_demo_load", args, record_numbers(report), command, results,
                   note=f"{report['requests']} requests{slowest}")
    print_json(args, report)
    return 1 if report["wrong"] else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
