"""What an export costs and what loading it costs, beside the checkpoint it came from.

    python benchmarks/bench_export.py runs/flickr8k_lstm_lite0 --repeats 5

Prints: the time to export (Hub layout, then with --onnx), the size of each file, and the time
to load the model from the checkpoint (torch.load, weights_only) and from the export
(safetensors + JSON, sha256 checked), the median of --repeats loads each, with the same captions
from both.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from captioner.apps.export import export_model
from captioner.core.runtime import set_threads
from captioner.models.captioner import Captioner
from captioner.models.checkpoint_format import checkpoint_file


def timed(action, repeats: int) -> tuple[float, object]:  # noqa: ANN001 - any callable
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = action()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint or a run folder")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    set_threads(args.threads)
    checkpoint = checkpoint_file(args.checkpoint)
    with tempfile.TemporaryDirectory() as tmp:
        plain, with_onnx = Path(tmp) / "export", Path(tmp) / "export_onnx"
        seconds, _ = timed(lambda: export_model(checkpoint, plain), 1)
        print(f"export (Hub layout, card, figure): {seconds:.1f} s")
        seconds, _ = timed(lambda: export_model(checkpoint, with_onnx, onnx=True), 1)
        print(f"export with --onnx: {seconds:.1f} s")
        print(f"checkpoint {checkpoint}: {size_of(checkpoint) / 1e6:.1f} MB (weights, optimizer and scheduler state, history)")
        for path in sorted(with_onnx.rglob("*")):
            if path.is_file():
                print(f"  {path.relative_to(with_onnx)}: {path.stat().st_size / 1e6:.2f} MB")
        pt_seconds, from_pt = timed(lambda: Captioner.from_pretrained(checkpoint, device="cpu"), args.repeats)
        ex_seconds, from_export = timed(lambda: Captioner.from_pretrained(plain, device="cpu"), args.repeats)
        print(f"load, median of {args.repeats}: checkpoint {pt_seconds * 1e3:.0f} ms, export {ex_seconds * 1e3:.0f} ms "
              f"({ex_seconds / pt_seconds:.2f}x)")
        weights_equal = all(
            (a == b).all() for a, b in zip(from_pt.state_dict().values(), from_export.state_dict().values(), strict=True)
        )
        print(f"same weights: {weights_equal}")


if __name__ == "__main__":
    main()
