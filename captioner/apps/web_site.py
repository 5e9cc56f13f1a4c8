"""`captioner export MODEL DIR --web`: a static site that captions in the visitor's browser with onnxruntime-web.
It holds the page (captioner/deploy/web/), the model's three ONNX graphs with their onnx.json (the manifest and spec
the Python runtime reads), a few public-domain example photographs and, with `--ort`, onnxruntime-web's own files;
nothing runs on a server and nothing in it names a place of the maker's machine."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np

import captioner
from captioner.core.bounded_files import read_json
from captioner.core.errors import ExportError
from captioner.core.files import (check_writable_folder, is_stage, set_aside_holds, sha256_of, staged_folder,
                                  write_atomically)
from captioner.models.captioner import Captioner
from captioner.text.vocab import bad_ending_ids

log = logging.getLogger(__name__)

ORT_VERSION = "1.30.0"  # the onnxruntime-web the page is written and tested against
ORT_CDN = f"https://cdn.jsdelivr.net/npm/onnxruntime-web@{ORT_VERSION}/dist/"
ORT_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
PAGE = Path(captioner.__file__).parent / "deploy" / "web"
PAGE_FILES = ("index.html", "app.js", "worker.js", "search.js", "preprocess.js", "style.css")
SITE_FORMAT, SITE_FORMAT_VERSION = "captioner web site", 1
SITE_JSON, MODEL_FOLDER = "site.json", "model"
HALF_MIN_ELEMENTS = 1024  # weights this large are stored in float16 (the graph casts them back to float32)


def write_site(model: Captioner, folder: str | Path, ort: str | Path | None = None,
               terms: str | None = None) -> list[Path]:
    """Write the site of `model` into `folder` (new, empty or an earlier site); `ort`: an installed
    onnxruntime-web (its package folder or dist/) to copy in, else the page loads it from a CDN. It is written
    whole beside the earlier site's files and then takes their place (`staged_folder`): a failure changes nothing."""
    from captioner.deploy.runtime import OnnxCaptioner
    from captioner.models.onnx_export import export_onnx

    folder = Path(folder)
    ort_files = check_ort(ort)
    check_site_folder(folder)
    examples = json.loads((PAGE / "examples" / "examples.json").read_text(encoding="utf-8"))
    written = {*PAGE_FILES, MODEL_FOLDER, "examples", "ort", SITE_JSON}  # an earlier site's: nothing stale stays
    with staged_folder(folder, written, marker=SITE_JSON) as stage, \
            tempfile.TemporaryDirectory(prefix="captioner-web-") as tmp:
        fp32, half = Path(tmp) / "onnx", Path(tmp) / "half"
        export_onnx(model, tmp)  # into tmp/onnx
        store_weights_in_half(fp32, half)
        photos = [PAGE / "examples" / example["file"] for example in examples]
        captions = [[c.text for c in OnnxCaptioner.from_folder(bundle).caption(photos)] for bundle in (fp32, half)]
        weights = "float16" if captions[0] == captions[1] else "float32"
        if weights == "float32":
            log.warning("weights kept in float32: in float16 the example photographs' captions change")
        shutil.copytree(half if weights == "float16" else fp32, stage / MODEL_FOLDER, copy_function=shutil.copyfile)
        copies = [(PAGE / name, stage / name) for name in PAGE_FILES]
        copies += [(PAGE / "examples" / example["file"], stage / "examples" / example["file"]) for example in examples]
        copies += [(path, stage / "ort" / path.name) for path in ort_files or []]
        for source, target in copies:
            target.parent.mkdir(exist_ok=True)
            shutil.copyfile(source, target)
        site = {
            "format": SITE_FORMAT, "format_version": SITE_FORMAT_VERSION, "captioner_version": captioner.__version__,
            "ort": {"version": ORT_VERSION, "source": "site" if ort_files else "cdn",
                    "url": "ort/" if ort_files else ORT_CDN},
            "model": MODEL_FOLDER + "/onnx.json", "weights": weights, "terms": terms, "examples": examples,
            "bad_endings": list(bad_ending_ids(model.vocab.index)),  # what `suppress_bad_endings` keeps from ending
        }
        write_atomically(stage / SITE_JSON, lambda tmp: tmp.write_text(json.dumps(site, indent=1), encoding="utf-8"))
    return sorted(p for p in folder.rglob("*") if p.is_file() and not any(is_stage(q) for q in p.parts))


def check_site_folder(folder: Path) -> None:
    """Refuse, in one line and before any model is loaded, a `folder` a site cannot be written into: one that
    cannot be made, or holds something other than an earlier site (one whose replacement a killed export cut short
    counts: its site.json is set aside, to be moved back)."""
    check_writable_folder(folder)
    if (folder.is_dir() and any(not is_stage(p.name) for p in folder.iterdir())
            and not (folder / SITE_JSON).is_file() and not set_aside_holds(folder, SITE_JSON)):
        raise ExportError(f"{folder}: not empty and not a captioner web site; give a new or empty folder")


def store_weights_in_half(source: Path, target: Path) -> None:
    """The bundle in `source` with every large float32 weight stored as float16 and cast back to float32 at
    the graph's start: half the bytes, the same float32 arithmetic (onnxruntime folds the casts when it loads)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    target.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((source / "onnx.json").read_text(encoding="utf-8"))
    for graph, entry in manifest["files"].items():
        proto = onnx.load(str(source / entry["path"]))
        casts = []
        for weight in proto.graph.initializer:  # a large one replaced, in its place, by its float16 copy
            if weight.data_type == TensorProto.FLOAT and int(np.prod(weight.dims)) >= HALF_MIN_ELEMENTS:
                half = numpy_helper.from_array(numpy_helper.to_array(weight).astype(np.float16), weight.name + ".half")
                casts.append(helper.make_node("Cast", [half.name], [weight.name], to=TensorProto.FLOAT))
                weight.CopyFrom(half)
        nodes = [*casts, *proto.graph.node]
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)
        onnx.save(proto, str(target / entry["path"]))
        entry["sha256"] = sha256_of(target / entry["path"])
    manifest["weights"] = "float16"
    (target / "onnx.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")


def check_ort(ort: str | Path | None) -> list[Path] | None:
    """The onnxruntime-web files the page loads, from an installed package (`node_modules/onnxruntime-web`
    or its dist/), checked to be the version the page is written for; None without `ort` (the CDN's). Called
    before any model is loaded too, so a wrong `--ort` is refused at once."""
    if ort is None:
        return None
    ort = Path(ort)
    package = ort.parent if ort.name == "dist" else ort
    if not (package / "package.json").is_file():
        raise ExportError(f"--ort {ort}: not an onnxruntime-web package (no package.json); install it with "
                          f"`npm install onnxruntime-web@{ORT_VERSION}` and give node_modules/onnxruntime-web")
    about = read_json(package / "package.json", "onnxruntime-web's package.json", ExportError)
    if not isinstance(about, dict):
        raise ExportError(f"--ort {ort}: package.json holds a {type(about).__name__}, not a package's fields")
    if about.get("name") != "onnxruntime-web" or about.get("version") != ORT_VERSION:
        raise ExportError(f"--ort {ort}: {about.get('name')} {about.get('version')}, but the page is written for "
                          f"onnxruntime-web {ORT_VERSION}")
    missing = [name for name in ORT_FILES if not (package / "dist" / name).is_file()]
    if missing:
        raise ExportError(f"--ort {ort}: dist/ lacks {', '.join(missing)}")
    return [package / "dist" / name for name in ORT_FILES]
