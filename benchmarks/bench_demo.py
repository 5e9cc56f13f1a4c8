"""Benchmark the demo end to end through its API, as a user's program would call it.

    python benchmarks/bench_demo.py runs/flickr8k_lstm_lite0/best.pt [--requests 20]

Starts `captioner demo CHECKPOINT` in a process of its own on a free local port (so the clients
here do not share its interpreter), then through gradio_client: one request for a 500x375
Flickr8k photo (upload, caption, heatmaps downloaded; then the figure, the page's second step),
timed a few times after a first one; then N concurrent requests, each thread with its own
client, all checked against the single request's caption.

`--untrained` first writes an untrained stand-in at CHECKPOINT when none is there: the ImageNet
EfficientNet-Lite0 encoder with a random LSTM decoder of the default size over the Flickr8k
vocabulary. It costs the same per step as a trained one, but never ends a caption, so every
caption runs to --max-length words.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_demo_load import wait_until_served  # noqa: E402
from shared_data import SHARED_DATA  # noqa: E402

DATA = SHARED_DATA
PHOTO = DATA / "flickr8k" / "images" / "1001773457_577c3a7d70.jpg"  # 500x375


def write_untrained(path: Path, max_length: int) -> None:
    from captioner.core.config import load_config
    from captioner.data.datasets import load_split
    from captioner.models.build import build_model
    from captioner.models.checkpoint import save_checkpoint
    from captioner.text.vocab import Vocabulary

    config = load_config(None, [
        "data.dataset=flickr8k", f"data.root={DATA / 'flickr8k'}", "data.image_size=224", "data.min_word_count=4",
        "model.encoder.name=efficientnet_lite0", "model.encoder.pretrained=true",
        "decode.beam_size=3", f"decode.max_length={max_length}",
    ])  # the LSTM decoder at its default size
    records = load_split(config.data, "train", check_images=False)
    vocab = Vocabulary.build((c for r in records for c in r.captions), config.data.min_word_count)
    save_checkpoint(path, build_model(config, vocab).eval())
    print(f"wrote an untrained lite0 + LSTM checkpoint ({len(vocab)} words) to {path}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(checkpoint: Path, port: int, timeout: float = 300.0) -> tuple[subprocess.Popen, str]:
    """`captioner demo CHECKPOINT` on 127.0.0.1:port, once it answers."""
    server = subprocess.Popen([sys.executable, "-m", "captioner.apps.cli", "demo", str(checkpoint), "--port", str(port)])
    url = f"http://127.0.0.1:{port}/"
    wait_until_served(server, url, timeout)
    return server, url


def ask(url: str, image: Path, beam: int, max_length: int, downloads: Path | None) -> tuple[float, tuple, float]:
    """One request from a fresh client, timed from the call to the answer with its heatmap images
    downloaded (or only their URLs, when `downloads` is None); then the figure of that caption
    (the page's second step), timed the same way."""
    from gradio_client import Client, handle_file

    client = Client(url, verbose=False, analytics_enabled=False, download_files=str(downloads) if downloads else False)
    started = time.perf_counter()
    answer = client.predict(handle_file(str(image)), beam_size=beam, max_length=max_length, api_name="/caption")
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    figure = client.predict(api_name="/figure")
    assert figure, figure
    return seconds, answer, time.perf_counter() - started


def check(answer: tuple, expected: str) -> bool:
    """The same caption, with one heatmap image for each of its words."""
    text, _, gallery, _ = answer
    return text == expected and len(gallery) == len(text.split()) and all(Path(item["image"]).is_file() for item in gallery)


def concurrent(url: str, image: Path, beam: int, max_length: int, n: int, downloads: Path) -> tuple[float, list[tuple[float, tuple]]]:
    """n threads, each with its own client, released together; the total is until the last answer."""
    from gradio_client import Client, handle_file

    clients = [Client(url, verbose=False, analytics_enabled=False, download_files=str(downloads / str(i))) for i in range(n)]
    gate = threading.Barrier(n + 1)
    answers: list[tuple[float, tuple] | None] = [None] * n

    def run(i: int) -> None:
        gate.wait()
        started = time.perf_counter()
        answer = clients[i].predict(handle_file(str(image)), beam_size=beam, max_length=max_length, api_name="/caption")
        answers[i] = (time.perf_counter() - started, answer)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    gate.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    total = time.perf_counter() - started
    return total, [a for a in answers if a is not None]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--image", type=Path, default=PHOTO)
    parser.add_argument("--beam", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=20)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="timed single requests after the warm-up")
    parser.add_argument("--untrained", action="store_true", help="write an untrained stand-in at CHECKPOINT if missing")
    args = parser.parse_args()

    if args.untrained and not args.checkpoint.exists():
        write_untrained(args.checkpoint, args.max_length)
    server, url = start_server(args.checkpoint, free_port())
    downloads = Path(tempfile.mkdtemp(prefix="bench-demo-"))
    print(f"{args.checkpoint} served on {url} with the CLI's settings; {os.cpu_count()} CPUs")
    try:
        cold, first, cold_figure = ask(url, args.image, args.beam, args.max_length, downloads)
        expected = first[0]
        print(f"caption: {expected!r}\n{first[1]}")
        print(f"first request (cold): caption + heatmaps {cold:.2f} s, then the figure {cold_figure:.2f} s")
        times, figures, answer_only = [], [], []
        for _ in range(args.repeats):
            seconds, answer, figure_seconds = ask(url, args.image, args.beam, args.max_length, downloads)
            assert check(answer, expected), answer
            times.append(seconds)
            figures.append(figure_seconds)
            answer_only.append(ask(url, args.image, args.beam, args.max_length, None)[0])
        print(
            f"one request, warm: caption + heatmaps downloaded median {statistics.median(times):.2f} s "
            f"(of {', '.join(f'{t:.2f}' for t in times)}); the answer alone (heatmap URLs) "
            f"{statistics.median(answer_only):.2f} s; then the figure {statistics.median(figures):.2f} s"
        )

        total, answers = concurrent(url, args.image, args.beam, args.max_length, args.requests, downloads)
        correct = sum(check(answer, expected) for _, answer in answers)
        latencies = sorted(seconds for seconds, _ in answers)
        print(
            f"{args.requests} concurrent requests: {correct}/{args.requests} correct, total {total:.2f} s "
            f"({total / args.requests:.2f} s per request); latency min {latencies[0]:.2f} / "
            f"median {statistics.median(latencies):.2f} / max {latencies[-1]:.2f} s"
        )
        return 0 if correct == args.requests else 1
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    raise SystemExit(main())
