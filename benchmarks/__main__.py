"""The benchmarks' one runner: `python -m benchmarks --list` names each, `python -m benchmarks NAME
[ARGS]` runs one (a module here with a `main(argv)` timing through `benchmarks/timing.py`). What each
decides is in docs/benchmarks.md, settled numbers in docs/results/bench_*.json. A user's mistake, here or in the
benchmark, is one line on stderr, `error: ...`, and exit status 2 (`timing.run_main`)."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# NAME -> module of this folder. Each still informs a default or checks a speed change.
BENCHMARKS = {
    "threads": "bench_threads",
    "cpu_amp": "bench_cpu_amp",
    "products": "bench_products",
    "stored_step": "bench_stored_step",
    "beam_photos": "bench_beam_photos",
    "same_captions": "same_captions",
    "metrics": "bench_metrics",
    "tokenizer": "bench_tokenizer",
    "onnx": "bench_onnx",
    "packaged_model": "bench_packaged_model",
    "demo_load": "bench_demo_load",
    "demo_pictures": "bench_demo_pictures",
    "web_page": "bench_web_page",
    "roofline": "bench_roofline",
    "allocator": "bench_allocator",
    "checkpoint_load": "bench_checkpoint_load",
    "reference": "bench_reference",
    "goals": "bench_goals",
    "gpu": "bench_gpu",
    "cuda_graphs": "check_cuda_graphs",
}


def describe(module: str) -> str:
    """The first sentence of a benchmark's docstring, read without importing it (or torch)."""
    doc = ast.get_docstring(ast.parse((HERE / f"{module}.py").read_text(encoding="utf-8"))) or ""
    return doc.split("\n\n")[0].replace("\n", " ").split(". ")[0].rstrip(".")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "--list"):
        if not argv or argv[0] != "--list":
            print("usage: python -m benchmarks NAME [ARGS] | --list\n")
        width = max(map(len, BENCHMARKS))
        for name, module in BENCHMARKS.items():
            print(f"{name:<{width}}  {describe(module)}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"error: python -m benchmarks: no benchmark {name!r} (python -m benchmarks --list names them)",
              file=sys.stderr)
        return 2
    if str(HERE.parent) not in sys.path:  # run as a file (python benchmarks/__main__.py) as well as with -m
        sys.path.insert(0, str(HERE.parent))
    try:
        module = importlib.import_module(f"benchmarks.{BENCHMARKS[name]}")
    except ModuleNotFoundError as e:  # a package of the environment missing: this Python is not the project's
        if e.name is None or e.name.partition(".")[0] in ("benchmarks", "captioner"):
            raise
        print(f"error: python -m benchmarks {name}: {sys.executable} has no {e.name!r}; run it in the project's "
              "environment with the test extras (bash scripts/run_tests.sh makes it; then source "
              ".venv/bin/activate)", file=sys.stderr)
        return 2
    from benchmarks.timing import run_main

    return run_main(module.main, rest)


if __name__ == "__main__":
    sys.exit(main())
