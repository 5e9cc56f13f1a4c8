"""Serving the page: the default model, its torch threads, starting the server, and stopping it cleanly.
Nothing here reaches the internet: no share link, no server-side rendering, analytics off."""

from __future__ import annotations

import errno
import logging
import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from captioner.apps.demo.batcher import MAX_BATCH
from captioner.apps.demo.decoding import DecodeProcess, Decoder, discard_prestarted, prestart
from captioner.apps.demo.ui import (
    QUEUE_SIZE, Cleanup, batch_sizes, build_demo, page_decoder, private_cache, wait_for_callbacks
)
from captioner.core.allocator import limit_arenas
from captioner.core.errors import CaptionerError
from captioner.core.process_settings import free_cores, threads_are_automatic
from captioner.models.model_paths import checkpoint_file, find_default_model
from captioner.models.export_format import is_exported

if TYPE_CHECKING:
    import gradio as gr

log = logging.getLogger(__name__)

MAX_FILE_SIZE = "10mb"  # uploads above this are refused by the server before any decoding
SESSIONS = 1000  # sessions whose state is kept (Gradio's 10,000 is a gigabyte of kept captions)


def default_checkpoint() -> Path:
    """The default model (`find_default_model`); a bare `captioner demo` never trains: none is one line."""
    found = find_default_model()
    return found if is_exported(found) else checkpoint_file(found)


def launch(demo: gr.Blocks, host: str = "127.0.0.1", port: int = 7860, block: bool = True,
           max_file_size: str | int = MAX_FILE_SIZE) -> str:
    """Serve the page; returns its URL (at once when not `block`). A port taken meanwhile is one line."""
    try:
        _, url, _ = demo.launch(
            server_name=host, server_port=port, share=False, prevent_thread_lock=not block, max_file_size=max_file_size,
            ssr_mode=False, pwa=False, mcp_server=False, enable_monitoring=False,
            show_error=False,  # no exception text in the page; the callbacks put messages there themselves
            quiet=True,  # no Gradio lines: serve() logs the URL, and the share=True hint is no option of ours
            state_session_capacity=SESSIONS,
        )
    except OSError as e:
        if "empty port" not in str(e) and e.errno != errno.EADDRINUSE:
            raise
        raise port_taken(host, port) from None
    return url


def port_taken(host: str, port: int) -> CaptionerError:
    """The one line for a port another process serves on."""
    return CaptionerError(f"demo --port {port}: port {port} on {host} is in use (another demo?); "
                          "give another with --port")


def check_port(host: str, port: int) -> int:
    """Bind to `port` on `host` and let go: a port in use or no local address is one line, before any model loads.
    Returns the port, for 0 the free one the system gave (Gradio's start-up check cannot reach port 0)."""
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise CaptionerError(f"demo --host {host}: not an address to serve on ({e.strerror})") from None
    with socket.socket(family, kind, protocol) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free to serve on
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise port_taken(host, port) from None
            raise CaptionerError(f"demo --host {host} --port {port}: cannot serve there ({e.strerror})") from None
        return probe.getsockname()[1]


def close(demo: gr.Blocks, timeout: float = 120.0) -> None:
    """Stop the server, wait for the captions in flight (a daemon worker inside torch at exit aborts Python), then
    end the decoding process."""
    demo.close()
    if not wait_for_callbacks(demo, timeout):
        log.warning("the demo closed with a caption still running after %.0f s", timeout)
    log.debug("caption batches by size: %s", batch_sizes(demo))
    if (decoder := page_decoder(demo)) is not None:
        decoder.close()


def choose_threads(decoder: Decoder) -> int:
    """The torch threads the page's captions decode with: $CAPTIONER_THREADS (this process's count), else
    `threads_that_pay` on one caption by each model, timed where they decode; the times at -v."""
    threads, _ = decoder.choose_threads(None)  # a decoding process started and given its models, now idle
    if not threads_are_automatic():
        log.debug("torch threads for captions: %d, as $CAPTIONER_THREADS says", threads)
        return threads
    threads, best = decoder.choose_threads(free_cores())  # counted once that process is idle
    log.debug("torch threads for captions: %d (one caption of each model: %s)", threads,
              ", ".join(f"{n} thread{'s' * (n > 1)} {s * 1000:.0f} ms" for n, s in best.items()) or "one core free")
    return threads


def serve(checkpoints: list[Path] | None = None, examples: list[Path] | None = None, host: str = "127.0.0.1",
          port: int = 7860, max_batch: int = MAX_BATCH, queue_size: int = QUEUE_SIZE,
          cleanup: Cleanup = Cleanup()) -> None:
    """`captioner demo`: the checkpoints (default: `default_checkpoint()`) until interrupted, in a cache of its own."""
    port = check_port(host, port)
    prestart()  # the decoding process loads torch meanwhile
    limit_arenas()  # one arena per worker thread would keep its freed pages
    cache = private_cache()
    cleanup = Cleanup(cleanup.every_s, cleanup.max_age_s, empty_folders=cache is not None)
    try:
        demo = build_demo(checkpoints or [default_checkpoint()], examples, max_batch, queue_size, cleanup=cleanup)
        decoder = page_decoder(demo)
        assert decoder is not None
        choose_threads(decoder)  # starts the decoding process: the first caption waits for nothing
        if isinstance(decoder, DecodeProcess):  # the page's own torch work (maps upsampled) beside it: one thread
            torch.set_num_threads(1)
        log.info("serving the demo on http://%s:%d", host, port)
        try:
            launch(demo, host, port, block=True)
        finally:  # interrupted: let the captions in flight finish before the interpreter exits
            close(demo)
    finally:
        discard_prestarted()  # none when the page was built: its decoder took it
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)
