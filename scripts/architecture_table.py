"""Write the generated sections of docs/architecture.md from the code, so the page cannot go stale:
the path from an image to a caption (each step's names found in the code) and the module tables
(line counts, first sentences of docstrings). `--check` exits 1 when the page differs."""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "captioner"
PAGE = REPO / "docs" / "architecture.md"
# bottom to top, as the contract
LAYERS = ("core", "text", "data", "models", "deploy", "evaluation", "training", "viz", "apps")
PATH_HEADING = "## From an image to a caption"
HEADING = "## Modules"
ABBREVIATIONS = ("et al.", "e.g.", "i.e.", "vs.")


class Step(NamedTuple):  # not a dataclass: tests load this file without registering it in sys.modules
    """One step of the path: what goes in and out, and the names `layer` defines for it (a top-level
    function, class or constant, or Class.method)."""

    name: str
    what: str
    layer: str
    names: tuple[str, ...]


# The path every caller takes. Steps 1 to 7 are what `Captioner.caption` runs; the last rows are
# the callers that turn a Caption into something a person reads.
PATH = (
    Step("load", "an image file, its bytes or an upload -> an upright 8-bit RGB picture (EXIF orientation "
         "applied, any mode made RGB); a broken or hostile file is one `ImageLoadError` naming it", "data",
         ("load_image",)),
    Step("transform", "the picture -> uint8 (3, S, S) at the size the model was trained at (training adds a mild "
         "crop and jitter, never a flip)", "data", ("ImageTransform",)),
    Step("normalise", "uint8 images (B, 3, S, S) -> float32 with the backbone's mean and std, on the device, as "
         "the encoder's first layer", "data", ("PixelNormalization",)),
    Step("encode", "images (B, 3, S, S) -> feats (B, N, D) on a grid (h, w), N = h*w; the CNN comes from the "
         "backbone registry", "models", ("Encoder", "BACKBONES")),
    Step("step the decoder", "the previous words and the state -> log-probabilities (B, V) of the next word and "
         "its attention over the N cells; the LSTM attends additively, the transformer with cross-attention",
         "models", ("Decoder.step", "LSTMDecoder", "TransformerDecoder")),
    Step("search", "feats -> each image's best word sequences with their scores and attention: greedy decoding, "
         "beam search or sampling as the `DecodeOptions` say, through `Decoder.step` alone", "models",
         ("decode_hypotheses",)),
    Step("caption", "a finished sequence -> `Caption`: text, words, tokens, score and attention maps (T, L, H, h, w)",
         "core", ("Caption",)),
    Step("all of the above", "steps 1 to 7 for a list of images, in batches: the object the library, the CLI, "
         "evaluation and the demo all caption with", "models", ("Captioner.caption",)),
    Step("without torch", "the same steps from an ONNX export, with onnxruntime, numpy and Pillow (the same loader)",
         "deploy", ("OnnxCaptioner",)),
    Step("overlays", "a Caption's attention maps -> heatmaps over the image, word by word", "viz", ("word_overlays",)),
    Step("metrics", "a split's captions -> the official COCO scores and the attention grounding score",
         "evaluation", ("evaluate",)),
    Step("CLI and demo", "`captioner caption` prints captions (and draws figures on request); the Gradio page "
         "shows a caption word by word over the image", "apps", ("commands/caption.py", "caption_page")),
)


def first_sentence(docstring: str | None) -> str:
    """The docstring's first sentence, on one line, without its final period (a period ends a
    sentence when a space or the end follows, and it ends no abbreviation)."""
    text = " ".join((docstring or "").split())
    masked = text
    for abbreviation in ABBREVIATIONS:
        masked = masked.replace(abbreviation, abbreviation.replace(".", "\0"))
    end = re.search(r"\.(?=\s|$)", masked)
    sentence = text[: end.start()] if end else text
    return sentence.replace("|", "\\|")


def docstring(path: Path) -> str | None:
    return ast.get_docstring(ast.parse(path.read_text()))


def defined_names(tree: ast.Module) -> set[str]:
    """The top-level functions, classes and constants of a module, and each class's as Class.member."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names |= {f"{node.name}.{member.name}" for member in node.body
                          if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef))}
        targets = (node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign)
                   else [])
        names |= {target.id for target in targets if isinstance(target, ast.Name)}
    return names


def where(layer: str, name: str) -> Path:
    """The one module of `layer` that defines `name` (or the module `name` is, a path ending .py)."""
    package = PACKAGE / layer
    if name.endswith(".py"):
        found = [package / name] if (package / name).is_file() else []
    else:
        found = [path for path in sorted(package.rglob("*.py")) if name in defined_names(ast.parse(path.read_text()))]
    if len(found) != 1:
        modules = ", ".join(str(path.relative_to(REPO)) for path in found) or "no module"
        raise LookupError(f"the path's step names {name!r} in captioner/{layer}/, which {modules} defines: "
                          f"edit PATH in {Path(__file__).relative_to(REPO)}")
    return found[0]


def path_cell(step: Step) -> str:
    cells = []
    for name in step.names:
        module = where(step.layer, name).relative_to(PACKAGE).as_posix()
        link = f"[{module}](../captioner/{module})"
        cells.append(link if name.endswith(".py") else f"`{name}` in {link}")
    return "; ".join(cells)


def path_section() -> str:
    out = [PATH_HEADING, "",
           "Steps 1 to 7 are what captioning an image runs, in order, each with the module that holds it;",
           "step 8 runs them for a list of images, and the rows after it are the twin without torch and the",
           ("callers that turn a Caption into what a person reads. "
            "Written by `python scripts/architecture_table.py`,"),
           "which finds each name in the code: a test fails when one moves and the page is not rewritten.", "",
           "| # | step | in -> out | where |", "|---:|---|---|---|"]
    out += [f"| {i} | {step.name} | {step.what} | {path_cell(step)} |" for i, step in enumerate(PATH, 1)]
    out.append("")
    return "\n".join(out)


def module_rows(package: Path) -> list[tuple[str, int, str]]:
    """(dotted name below the layer, lines, job) of every module of a layer, sub-packages included."""
    rows = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).with_suffix("")
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        if not parts:
            continue  # the layer's own __init__: its docstring heads the table
        lines = len(path.read_text().splitlines())
        rows.append((".".join(parts), lines, first_sentence(docstring(path))))
    return sorted(rows)


def section() -> str:
    out = [HEADING, "",
           "Written by `python scripts/architecture_table.py` from the code (a test fails when it is stale):",
           "each module's line count and the first sentence of its docstring.", ""]
    for layer in LAYERS:
        package = PACKAGE / layer
        out += [f"**{layer}/** ({first_sentence(docstring(package / '__init__.py'))})", "", "| module | lines | job |",
                "|---|---:|---|"]
        out += [f"| `{name}` | {lines} | {job} |" for name, lines, job in module_rows(package)]
        out.append("")
    return "\n".join(out)


def rewritten(page: str) -> str:
    """The page with both generated sections rewritten: the path runs to the next heading of its
    level, the module tables to the end of the page."""
    start = page.index(PATH_HEADING)
    end = page.index("\n## ", start + len(PATH_HEADING)) + 1
    page = page[:start] + path_section() + "\n" + page[end:]
    return page[: page.index(HEADING)] + section()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report whether the page is current; change nothing")
    args = parser.parse_args()
    page = PAGE.read_text()
    try:
        new = rewritten(page)
    except LookupError as e:
        print(f"{PAGE}: {e}", file=sys.stderr)
        return 1
    if args.check:
        if new != page:
            print(f"{PAGE} is stale: run python scripts/architecture_table.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    print(f"wrote the path and the module tables of {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
