"""A trained checkpoint -> a folder anyone can load and publish (Hub layout, model card, attention figure, recipe;
ONNX on request), and its upload to the Hub; nothing written names a place of the machine that wrote it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PIL import Image

from captioner.apps.model_card import FIGURE, data_terms, model_card, read_card, read_scores, with_recipe
from captioner.core.bounded_files import read_json
from captioner.core.files import check_writable_folder, sha256_of, staged_folder, write_atomically
from captioner.core.config_sections import DecodeConfig
from captioner.core.errors import CaptionerError, ExportError, ImageLoadError, first_line
from captioner.core.portable_config import portable_config
from captioner.data.image_files import load_image
from captioner.data.model_settings import StoredSettings, stored_settings
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import config_source, run_config, written_by_its_run
from captioner.models.checkpoint_format import read_checkpoint
from captioner.models.export_format import CARD, CONFIG, VOCAB, WEIGHTS, is_exported, read_config
from captioner.models.model_origin import nested
from captioner.models.model_paths import checkpoint_file, network_errors

log = logging.getLogger(__name__)

WRITTEN = {WEIGHTS, CONFIG, VOCAB, CARD, FIGURE, "onnx"}  # what an export folder may already hold
TRACE_MARK = b"pkg.torch.onnx.stack_trace"  # the dynamo exporter's record of the source lines it traced


def export_model(checkpoint: str | Path, folder: str | Path, image: str | Path | None = None, onnx: bool = False,
                 decode: Mapping[str, Any] | None = None, web: bool = False,
                 ort: str | Path | None = None) -> list[Path]:
    """Export `checkpoint` (a .pt file or a run folder) into `folder`; returns the files written. `decode`
    (DecodeConfig fields) replaces the checkpoint's decoding, so every user decodes as its test scores were measured.
    `web`: the static site of apps/web_site.py instead (of any model, exported folders and packaged ones too).
    Everything is checked and computed first, then written into a hidden folder and moved in whole
    (`staged_folder`): a failure leaves `folder` as it was, and an earlier export there leaves nothing behind."""
    source = checkpoint_file(checkpoint)
    folder = Path(folder)
    check_writable_folder(folder)  # before any work, so its one line is all a user sees
    if web:
        return _web_site(source, folder, decode, ort)
    if is_exported(source):
        if not onnx:
            raise ExportError(f"{source}: already an exported folder; export takes a checkpoint (.pt) or a run folder "
                              "(or an exported folder with --onnx, for the runtime without PyTorch)")
        from captioner.models.onnx_export import SUBFOLDER, export_onnx

        model = Captioner.from_pretrained(source, "cpu")  # the ONNX bundle alone: the export has its card and figure
        with_decoding(model, decode)
        with staged_folder(folder, {SUBFOLDER}, marker=SUBFOLDER) as stage:
            files = export_onnx(model, stage)
        return moved(files, stage, folder)
    if folder.is_dir():
        foreign = sorted(p.name for p in folder.iterdir() if p.name not in WRITTEN and not p.name.endswith(".tmp"))
        if foreign:
            raise ExportError(f"{folder}: not empty ({', '.join(foreign[:3])} ...) and not an export; "
                              "give a new or empty folder")
    payload = read_checkpoint(source, for_inference=True)  # read once: the weights, the run config and the history
    config = run_config(payload["config"], source)
    model = Captioner.from_checkpoint_payload(payload, source).eval()
    with_decoding(model, decode)
    scores = read_scores(source, payload.get("train_state"))
    data = stored_settings(config, config_source(source), keep_local_places=written_by_its_run(source, config))
    example = _figure_image(image, data)
    figure = (example[1], model.caption(example[1])) if example is not None else None  # a failure writes nothing
    card = model_card(folder.resolve().name, model, data.config, scores, example[0].name if example else None,
                      recipe=config.to_dict())
    with staged_folder(folder, WRITTEN, marker=CONFIG) as stage:
        files = model.save_pretrained(stage, training_config=config.to_dict(), scores=dataclasses.asdict(scores))
        if figure is not None:
            from captioner.viz.overlays import save_attention_figure

            files.append(save_attention_figure(stage / FIGURE, *figure))
        write_atomically(stage / CARD, lambda tmp: tmp.write_text(card, encoding="utf-8"))
        files.append(stage / CARD)
        if onnx:
            from captioner.models.onnx_export import export_onnx

            files += export_onnx(model, stage)
    return moved(files, stage, folder)


def moved(files: list[Path], stage: Path, folder: Path) -> list[Path]:
    """`files` written into `stage`, as their paths in `folder` once `staged_folder` moved them there."""
    return [folder / path.relative_to(stage) for path in files]


def _web_site(source: Path, folder: Path, decode: Mapping[str, Any] | None, ort: str | Path | None) -> list[Path]:
    """The site of the model at `source`, its data terms those its card gives (or its dataset's)."""
    from captioner.apps.web_site import check_ort, check_site_folder, write_site

    check_site_folder(folder)  # before the model loads, so a refusal comes at once
    check_ort(ort)
    if is_exported(source):
        model = Captioner.from_pretrained(source, "cpu")
        config = read_config(source)  # a stranger's: any field may be of another shape, and is then left out
        dataset, terms = nested(config, "training_config", "data", "dataset"), nested(config, "packaged", "data_terms")
        terms = terms if isinstance(terms, str) else data_terms(dataset) if isinstance(dataset, str) else None
    else:
        payload = read_checkpoint(source, for_inference=True)
        model = Captioner.from_checkpoint_payload(payload, source)
        terms = data_terms(run_config(payload["config"], source).data.dataset)
    with_decoding(model, decode)
    return write_site(model.eval(), folder, ort, terms)


def with_decoding(model: Captioner, decode: Mapping[str, Any] | None, command: str = "export") -> None:
    """`decode`'s DecodeConfig fields in place of the model's; an unknown field is one line naming `command`."""
    if not decode:
        return
    unknown = set(decode) - {f.name for f in dataclasses.fields(DecodeConfig)}
    if unknown:
        raise ExportError(f"{command}: unknown decode setting(s) {', '.join(sorted(unknown))}")
    model.decode_config = dataclasses.replace(model.decode_config, **decode)


def _figure_image(image: str | Path | None, data: StoredSettings) -> tuple[Path, Image.Image] | None:
    """The image the card's figure captions, and its picture: the one given, else the first test image that loads,
    else None."""
    if image is not None:
        return Path(image), load_image(image)  # a bad --image is the user's error: its one line, not a silent skip
    if data.config.data.dataset == "webdataset":
        log.warning("no attention figure on the card: a shard's images are no files to name; give --image")
        return None
    if data.config.data.dataset == "shapes" and not (Path(data.config.data.root) / "captions_test.json").is_file():
        log.warning("no attention figure on the card: the shapes world is not at %s (never generated for a figure); "
                    "give --image", data.config.data.root)
        return None
    try:
        records = data.load_split("test", check_images=False)
    except CaptionerError as e:
        log.warning("no attention figure on the card: the model's test images are not here (%s); give --image", e)
        return None
    for record in [r for r in records if r.stored is None][:20]:  # a figure needs a file to name
        with contextlib.suppress(ImageLoadError):
            return Path(record.path), load_image(record.path)
    log.warning("no attention figure on the card: none of the first test images loads; give --image")
    return None


def push_model(checkpoint: str | Path, repo_id: str, private: bool = False, image: str | Path | None = None) -> str:
    """Upload an export (a checkpoint exported first) to the Hub repo `repo_id`, created if missing; its URL."""
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise ExportError(f"push {repo_id}: offline (HF_HUB_OFFLINE is set); unset it to upload")
    if not get_token():
        raise ExportError(f"push {repo_id}: no Hugging Face token; run `hf auth login` or set HF_TOKEN "
                          "to a token with write access")
    source = checkpoint_file(checkpoint)
    with tempfile.TemporaryDirectory(prefix="captioner-push-") as tmp:
        folder = Path(tmp) / Path(repo_id).name
        if not is_exported(source):
            export_model(source, folder, image=image)
        elif make_portable(source, write=False):  # an export written before its places were left out, or by hand
            shutil.copytree(source, folder)
            make_portable(folder)
        else:
            folder = source
        api = HfApi()
        try:
            url = api.create_repo(repo_id, private=private, exist_ok=True)
            api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="Upload captioner model")
        except HfHubHTTPError as e:
            raise ExportError(f"push {repo_id}: the Hub refused ({first_line(e, 160)})") from None
        except (OSError, *network_errors()) as e:  # no route to the Hub
            raise ExportError(f"push {repo_id}: could not reach the Hub ({first_line(e, 160)})") from None
    return str(url)


def make_portable(folder: Path, write: bool = True) -> bool:
    """Write the exported `folder`'s config.json, card and ONNX graphs again, in place, naming no place of the
    machine that made them; whether anything differed (with `write=False`, nothing is written)."""
    config = read_config(folder)
    graphs = folder / "onnx"  # those holding the exporter's trace records (exported before they were stripped)
    traced = sorted(p.name for p in graphs.glob("*.onnx") if TRACE_MARK in p.read_bytes()) if graphs.is_dir() else []
    stored = config.get("training_config") if isinstance(config.get("training_config"), dict) else None
    card = read_card(folder / CARD)[1] if (folder / CARD).is_file() else None
    recipe = portable_config(stored) if stored is not None else None
    new_card = with_recipe(card, stored) if card is not None and stored is not None else card
    if recipe == stored and new_card == card and not traced:
        return False
    if not write:
        return True
    if traced:
        strip_traced_graphs(folder, traced)
    if new_card != card:
        write_atomically(folder / CARD, lambda tmp: tmp.write_text(new_card, encoding="utf-8"))
        if isinstance(config["files"], dict) and CARD in config["files"]:
            config["files"][CARD] = {"sha256": sha256_of(folder / CARD), "bytes": (folder / CARD).stat().st_size}
    if stored is not None:
        config["training_config"] = recipe
    write_atomically(folder / CONFIG, lambda tmp: tmp.write_text(json.dumps(config, indent=1), encoding="utf-8"))
    return True


def strip_traced_graphs(folder: Path, names: list[str]) -> None:
    """`strip_trace_records` on each named graph of `folder`/onnx/, and their checksums in onnx.json after it."""
    from captioner.models.onnx_export import MANIFEST, strip_trace_records

    manifest_path = folder / "onnx" / MANIFEST
    manifest = read_json(manifest_path, f"model's {MANIFEST}", ExportError) if manifest_path.is_file() else None
    entries = manifest.get("files") if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) else {}
    for name in names:
        strip_trace_records(folder / "onnx" / name)
        for entry in entries.values():
            if isinstance(entry, dict) and entry.get("path") == name:
                entry["sha256"] = sha256_of(folder / "onnx" / name)
    if manifest is not None:
        write_atomically(manifest_path, lambda tmp: tmp.write_text(json.dumps(manifest, indent=1), encoding="utf-8"))
