"""The exported web page (`captioner export MODEL DIR --web`) in headless Chromium on this CPU: bytes on disk and
gzip-compressed, bytes a first visit transfers, cold start to the first caption with its word maps, and each next
caption, with one thread (a plain server) and with threads (a server sending the COOP/COEP headers).

Needs Chromium (/usr/bin/chromium), playwright and onnxruntime-web (`npm ci` in the repository: node_modules/);
the photographs are the golden Flickr8k test photographs of tests/data/packaged_captions.json when ../shared/data
is there, else the site's own examples."""

from __future__ import annotations

import functools
import gzip
import http.server
import json
import runpy
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.timing import argument_parser, print_environment, run_main  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ORT = REPO / "node_modules" / "onnxruntime-web"
# transformers.js's image-to-text example, Xenova/vit-gpt2-image-captioning: about 250 MB of q8 ONNX weights, the
# figure the Hub's file listing gives (not fetched here: the benchmark runs offline). For the same architecture,
# a report on transformers.js's tracker gives 158 MB for the q8 merged decoder alone.
VIT_GPT2_Q8_BYTES = 250_000_000


class Server(http.server.SimpleHTTPRequestHandler):
    """A static server that counts the bytes it sends; `isolated` adds the headers that allow threads."""

    isolated = False
    sent: list[int] = []

    def end_headers(self) -> None:
        if self.isolated:
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def copyfile(self, source, outputfile) -> None:  # noqa: ANN001 - http.server's signature
        data = source.read()
        self.sent.append(len(data))
        outputfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def serve(folder: Path, isolated: bool) -> tuple[http.server.ThreadingHTTPServer, list[int]]:
    sent: list[int] = []
    handler = type("Handler", (Server,), {"isolated": isolated, "sent": sent})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, sent


def sizes(site: Path) -> tuple[int, int]:
    files = [p for p in site.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), sum(len(gzip.compress(p.read_bytes(), 9)) for p in files)


def photographs(site: Path, shared: Path) -> list[Path]:
    if (shared / "flickr8k" / "images").is_dir():
        script = runpy.run_path(str(REPO / "scripts" / "packaged_captions.py"))
        count = len(json.loads((REPO / "tests" / "data" / "packaged_captions.json").read_text())["captions"])
        return script["test_photos"](shared / "flickr8k" / "images",
                                     shared / "flickr8k" / "Flickr_8k.testImages.txt", count)
    return sorted((site / "examples").glob("*.jpg"))


def visit(browser, site: Path, photos: list[Path], isolated: bool) -> dict:
    """One first visit: open the page, caption the first photograph as soon as it is ready, then the others."""
    server, sent = serve(site, isolated)
    url = f"http://127.0.0.1:{server.server_port}/index.html"
    page = browser.new_context().new_page()
    started = time.perf_counter()
    page.goto(url)
    page.wait_for_selector("body[data-ready]", timeout=120_000)
    ready = time.perf_counter() - started
    times, captions = [], []
    for photo in photos:
        began = time.perf_counter()
        page.set_input_files("#file", str(photo))
        page.wait_for_function("(name) => document.body.dataset.busy === 'false' && document.getElementById('status')"
                               ".textContent.startsWith(name)", arg=photo.name, timeout=60_000)
        page.wait_for_selector("#maps .map canvas")
        times.append(time.perf_counter() - (started if not times else began))
        captions.append(" ".join(page.locator("#caption .word").all_text_contents()))
    threads = page.evaluate("self.crossOriginIsolated")
    page.close()
    server.shutdown()
    return {"ready": ready, "first": times[0], "next": times[1:], "bytes": sum(sent), "captions": captions,
            "isolated": threads}


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("web_page", __doc__)
    parser.add_argument("--model", default="flickr8k_transformer_scst", help="the model to export (a name or path)")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--shared", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--site", type=Path, default=None, help="an exported site to measure (default: export one)")
    args = parser.parse_args(argv)
    if not Path(args.chromium).is_file():
        raise SystemExit(f"--chromium {args.chromium}: no such program (give the path of a Chromium)")
    if args.site is not None and not (args.site / "site.json").is_file():
        raise SystemExit(f"--site {args.site}: not an exported site (no site.json; captioner export MODEL DIR --web "
                         "makes one)")
    print_environment(args)
    from playwright.sync_api import sync_playwright

    from captioner.apps.web_site import write_site
    from captioner.models.captioner import Captioner
    from captioner.models.model_paths import checkpoint_file

    with tempfile.TemporaryDirectory() as tmp:
        site = args.site
        if site is None:
            site = Path(tmp) / "site"
            began = time.perf_counter()
            write_site(Captioner.from_pretrained(checkpoint_file(args.model), "cpu"), site, ort=ORT)
            print(f"exported {args.model} in {time.perf_counter() - began:.1f} s")
        about = json.loads((site / "site.json").read_text())
        on_disk, zipped = sizes(site)
        model = sum(p.stat().st_size for p in (site / "model").iterdir())
        ort = about["ort"]
        print(f"site: {on_disk / 1e6:.2f} MB on disk, {zipped / 1e6:.2f} MB gzip-compressed; model {model / 1e6:.2f} MB"
              f" ({about['weights']} weights); onnxruntime-web {ort['version']} from the {ort['source']}")
        print(f"transformers.js vit-gpt2 (q8), model files alone: about {VIT_GPT2_Q8_BYTES / 1e6:.0f} MB = "
              f"{VIT_GPT2_Q8_BYTES / model:.0f}x this model's")
        photos = photographs(site, args.shared)
        beam = json.loads((site / "model" / "onnx.json").read_text())["spec"]["decode"]["beam_size"]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            for isolated in (False, True):
                result = visit(browser, site, photos, isolated)
                label = "threads (COOP/COEP)" if result["isolated"] else "one thread (no COOP/COEP)"
                print(f"{label}: first visit transferred {result['bytes'] / 1e6:.2f} MB; ready in "
                      f"{result['ready']:.2f} s; first caption {result['first']:.2f} s after opening; next captions "
                      f"median {statistics.median(result['next']):.2f} s (max {max(result['next']):.2f}, "
                      f"n={len(result['next'])}); beam {beam}")
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
