"""A trained checkpoint -> a folder anyone can load and publish: the Hub layout
(`models/export_format`: safetensors, config.json, vocab.json), a model card with the scores
the run recorded and one attention figure, and on request the ONNX graphs; and its upload to the
Hugging Face Hub."""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from captioner.apps.model_card import model_card, read_scores
from captioner.core.config_sections import DecodeConfig
from captioner.core.errors import CaptionerError, ExportError, ImageLoadError
from captioner.data.image_files import load_image
from captioner.data.model_settings import StoredSettings, stored_settings
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import config_source, run_config, written_by_its_run
from captioner.models.checkpoint_format import read_checkpoint
from captioner.models.export_format import CARD, CONFIG, VOCAB, WEIGHTS, is_exported
from captioner.models.hub import network_errors
from captioner.models.model_paths import checkpoint_file

log = logging.getLogger(__name__)

FIGURE = "attention.png"
WRITTEN = {WEIGHTS, CONFIG, VOCAB, CARD, FIGURE, "onnx"}  # what an export folder may already hold


def export_model(
    checkpoint: str | Path, folder: str | Path, image: str | Path | None = None, onnx: bool = False,
    decode: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Export `checkpoint` (a .pt file or a run folder) into `folder`; returns the files written.

    The figure captions `image`, else the first test image of the model's dataset that loads;
    without one the card says so and has no figure. The card and the figure read the model's
    dataset only where its settings may name it (`data/model_settings.py`): no shard pattern, URL
    or command, and no place outside the working folder unless the checkpoint lies in the run
    folder it was written to. `decode` (DecodeConfig fields, such as a
    length penalty tuned on dev after training) replaces those of the checkpoint's decode section,
    so every user of the export decodes as its test scores were measured."""
    source = checkpoint_file(checkpoint)
    if is_exported(source):
        if not onnx:
            raise ExportError(f"{source}: already an exported folder; export takes a checkpoint (.pt) or a run folder "
                              "(or an exported folder with --onnx, for the runtime without PyTorch)")
        return exported_to_onnx(source, Path(folder), decode)
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ExportError(f"{folder}: exists and is not a folder")
    if folder.is_dir():
        foreign = sorted(p.name for p in folder.iterdir() if p.name not in WRITTEN and not p.name.endswith(".tmp"))
        if foreign:
            raise ExportError(f"{folder}: not empty ({', '.join(foreign[:3])} ...) and not an export; give a new or empty folder")
    payload = read_checkpoint(source)  # read once: the weights, the run config and the history
    config = run_config(payload["config"], source)
    model = Captioner.from_checkpoint_payload(payload, source).eval()
    with_decoding(model, decode)
    scores = read_scores(source, payload.get("train_state"))
    files = model.save_pretrained(
        folder,
        training_config=config.to_dict(),
        scores={"validation": scores.validation, "validation_epoch": scores.validation_epoch, "test": scores.test},
    )
    data = stored_settings(config, config_source(source), keep_local_places=written_by_its_run(source, config))
    example = _figure_image(image, data)
    figure = None
    if example is not None:
        from captioner.viz.overlays import save_attention_figure

        picture = load_image(example)
        caption = model.caption(picture)
        files.append(save_attention_figure(folder / FIGURE, picture, caption))
        figure = FIGURE
    card = model_card(
        folder.name, data.config, len(model.vocab), sum(p.numel() for p in model.parameters()), model.grid_size(), scores,
        figure, Path(example).name if example is not None else None,
    )
    (folder / CARD).write_text(card, encoding="utf-8")
    files.append(folder / CARD)
    if onnx:
        from captioner.models.onnx_export import export_onnx

        files += export_onnx(model, folder)
    return files


def exported_to_onnx(source: Path, folder: Path, decode: Mapping[str, Any] | None) -> list[Path]:
    """An exported folder (the model packaged with captioner, say) as the ONNX bundle alone
    (`folder`/onnx/), for the runtime without PyTorch: the export already holds its card and figure."""
    from captioner.models.onnx_export import export_onnx

    model = Captioner.from_pretrained(source, "cpu")
    with_decoding(model, decode)
    return export_onnx(model, folder)


def with_decoding(model: Captioner, decode: Mapping[str, Any] | None) -> None:
    """`decode`'s DecodeConfig fields (a length penalty tuned on dev, say) in place of the model's;
    an unknown field is one line."""
    if not decode:
        return
    unknown = set(decode) - {f.name for f in dataclasses.fields(DecodeConfig)}
    if unknown:
        raise ExportError(f"export: unknown decode setting(s) {', '.join(sorted(unknown))}")
    model.decode_config = dataclasses.replace(model.decode_config, **decode)


def _figure_image(image: str | Path | None, data: StoredSettings) -> Path | None:
    """The image the card's figure captions: the one given (it must load), else the first test
    image of the model's dataset that loads (where its settings may name it), else None (logged)."""
    if image is not None:
        load_image(image)  # a bad --image is the user's error: its one line, not a silent skip
        return Path(image)
    if data.config.data.dataset == "webdataset":
        log.warning("no attention figure on the card: a shard's images are no files to name; give --image")
        return None
    if data.config.data.dataset == "shapes" and not (Path(data.config.data.root) / "captions_test.json").is_file():
        log.warning("no attention figure on the card: the shapes world is not at %s (never generated for a figure); give --image", data.config.data.root)
        return None
    try:
        records = data.load_split("test", check_images=False)
    except CaptionerError as e:
        log.warning("no attention figure on the card: the model's test images are not here (%s); give --image", e)
        return None
    for record in [r for r in records if r.stored is None][:20]:  # a figure needs a file to name
        try:
            load_image(record.path)
            return Path(record.path)
        except ImageLoadError:
            continue
    log.warning("no attention figure on the card: none of the first test images loads; give --image")
    return None


def push_model(checkpoint: str | Path, repo_id: str, private: bool = False, image: str | Path | None = None) -> str:
    """Upload an exported folder (or export a checkpoint first, into a temporary folder) to the
    Hub repo `repo_id`, created if missing; returns the repo's URL. Offline, without a token, or
    when the Hub refuses: one line naming what is missing."""
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise ExportError(f"push {repo_id}: offline (HF_HUB_OFFLINE is set); unset it to upload")
    if not get_token():
        raise ExportError(f"push {repo_id}: no Hugging Face token; run `hf auth login` or set HF_TOKEN to a token with write access")
    source = checkpoint_file(checkpoint)
    with tempfile.TemporaryDirectory(prefix="captioner-push-") as tmp:
        folder = source if is_exported(source) else Path(tmp) / Path(repo_id).name
        if not is_exported(source):
            export_model(source, folder, image=image)
        api = HfApi()
        try:
            url = api.create_repo(repo_id, private=private, exist_ok=True)
            api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="Upload captioner model")
        except HfHubHTTPError as e:
            raise ExportError(f"push {repo_id}: the Hub refused ({str(e).splitlines()[0][:160]})") from None
        except (OSError, *network_errors()) as e:  # no route to the Hub
            raise ExportError(f"push {repo_id}: could not reach the Hub ({str(e).splitlines()[0][:160]})") from None
    return str(url)
