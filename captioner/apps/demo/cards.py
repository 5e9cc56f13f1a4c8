"""The served models: loading, menu labels, serving line, cards and example images (no Gradio).
Examples come only from places a model's settings may name (`models.checkpoint.model_settings`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from captioner.apps.model_card import DATASETS, METRICS, read_scores
from captioner.core.config import config_from_dict
from captioner.core.config_sections import Config
from captioner.core.errors import CaptionerError
from captioner.data.datasets import load_split
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import load_captioner, model_settings, read_checkpoint
from captioner.models.export_format import is_exported, read_config
from captioner.models.model_origin import nested


def load_models(checkpoints: list[Path], device: str = "cpu") -> dict[str, Captioner]:
    """Checkpoint path -> model; a bad checkpoint stops the start with its one-line error."""
    if not checkpoints:
        raise CaptionerError("demo: no checkpoint to serve")
    return {str(path): load_captioner(path, device) for path in dict.fromkeys(checkpoints)}


def model_label(path: str, model: Captioner) -> str:
    """What the model menu shows: 'run/best.pt (lstm over small_cnn)'."""
    name = Path(path)
    return f"{name.parent.name}/{name.name} ({model.config.decoder.type} over {model.config.encoder.name})"


def best_row(state: Any) -> dict[str, Any] | None:
    """The history row of the best validation (its epoch, and its step when mid-epoch), else the last; rows of
    another shape (a stranger's model) are left out."""
    history = state.get("history") if isinstance(state, dict) else None
    history = [row for row in history if isinstance(row, dict)] if isinstance(history, list) else []
    if not history:
        return None
    best_epoch, best_step = state.get("best_epoch"), state.get("best_step")
    return next((r for r in history if r.get("epoch") == best_epoch and best_step in (None, r.get("step"))),
                history[-1])


def model_card(path: str, model: Captioner, payload: dict[str, Any]) -> str:
    """One Markdown line: what a served model was trained on and how it scored on validation."""
    config = config_from_dict(payload["config"], source=path) if payload.get("config") else None
    state = payload.get("train_state") if isinstance(payload.get("train_state"), dict) else {}
    row = best_row(state)
    metric = config.train.val_metric if config else "?"
    if row:
        scores = ", ".join(f"{k[4:]} {float(v):.3f}" for k, v in row.items()
                           if isinstance(k, str) and k.startswith("val_") and isinstance(v, (int, float)))
        where = f"epoch {row['epoch']}" + (f", step {row['step']}" if "epochs_done" in row else "")  # mid-epoch
        val = f"validation at {where} of {state.get('epoch', '?')} (best {metric}): {scores}"
    else:
        val = "no validation scores in the checkpoint"
    dataset = config.data.dataset if config else "an unknown dataset"
    return (f"**{model_label(path, model)}**: trained on **{dataset}** ({model.image_size} px images), "
            f"vocabulary {len(model.vocab)} words; {val}.")


def model_cards(models: dict[str, Captioner], payloads: dict[str, dict[str, Any]] | None = None) -> str:
    """What every served model was trained on, so a caption is read in its light."""
    payloads = payloads or {}
    lines = [f"- {model_card(path, model, payloads[path] if path in payloads else recorded(path))}"
             for path, model in models.items()]
    return "**Models served**\n\n" + "\n".join(lines)


def recorded(path: str) -> dict[str, Any]:
    """What the page reads of a served model besides its weights: `config`, `train_state`, `test`; {} if unreadable."""
    try:
        if not is_exported(path):
            payload = read_checkpoint(path, for_inference=True)
            return {"config": payload["config"], "train_state": payload.get("train_state"),
                    "test": read_scores(Path(path), None).test}
        config = read_config(Path(path))  # an export: its training config and the scores it recorded
    except CaptionerError:
        return {}
    # A stranger's config.json: a field of another shape is left out, as if not recorded.
    scores = config.get("scores") if isinstance(config.get("scores"), dict) else {}
    validation = scores.get("validation") if isinstance(scores.get("validation"), dict) else {}
    epoch = scores.get("validation_epoch")
    row = {"epoch": epoch, **{f"val_{k}": v for k, v in validation.items()}}
    training, test = config.get("training_config"), scores.get("test")
    return {"config": training if isinstance(training, dict) else {}, "test": test if isinstance(test, dict) else {},
            "train_state": {"history": [row] if validation else [], "best_epoch": epoch, "epoch": epoch}}


SERVING_METRICS = ("Bleu_4", "METEOR", "CIDEr")  # the serving line's scores, by COCO's names


def serving_line(path: str, model: Captioner, payload: dict[str, Any]) -> str:
    """Markdown: 'Serving: <model> — <dataset>, test BLEU-4 x, METEOR y, CIDEr-D z (beam 3)', else validation's."""
    try:
        config = config_from_dict(payload["config"], source=path) if payload.get("config") else None
    except CaptionerError:
        config = None
    name = model_label(path, model)
    if config is not None and is_exported(path) and Path(config.train.out_dir).name != Path(path).name:
        name += f", exported from {Path(config.train.out_dir).name}"
    dataset = DATASETS.get(config.data.dataset, (config.data.dataset,))[0] if config else "an unknown dataset"
    test = nested(payload, "test", "test")
    test = test if isinstance(test, dict) else {}
    row = best_row(payload.get("train_state") or {})
    validation = {k[len("val_"):]: v for k, v in (row or {}).items() if k.startswith("val_")}
    if named_scores(test.get("overall") if isinstance(test.get("overall"), dict) else {}):
        beam = f" (beam {test['beam_size']})" if test.get("beam_size") else ""
        scores = f"test {named_scores(test['overall'])}{beam}"
    elif named_scores(validation):
        beam = f", beam {config.train.val_beam_size}" if config else ""
        scores = (f"validation {named_scores(validation)} (epoch {row.get('epoch', '?')}{beam}; "
                  "no test scores recorded)")
    else:
        scores = "no test or validation scores recorded"
    return f"**Serving:** {name} — {dataset}, {scores}"


def named_scores(overall: dict[str, Any]) -> str:
    """'BLEU-4 0.200, METEOR 0.190, CIDEr-D 0.500' for those of SERVING_METRICS in `overall`."""
    return ", ".join(f"{METRICS[m][1]} {float(overall[m]):.3f}" for m in SERVING_METRICS
                     if isinstance(overall.get(m), (int, float)))


def model_examples(path: str | Path, count: int = 4) -> list[Path]:
    """The first test images of the model's dataset, where they lie locally and its settings may name them."""
    settings = model_settings(path)
    return [] if settings.unreadable("test") else dataset_examples(settings.config, count)


def dataset_examples(config: Config, count: int = 4) -> list[Path]:
    """The first test images of the dataset `config` describes, where they lie locally."""
    data = config.data
    if data.dataset == "shapes" and not (Path(data.root) / "captions_test.json").is_file():
        return []  # never generate a dataset just for examples
    if data.dataset == "webdataset":
        return []  # a shard's samples are no files: a record's path is only its name
    try:
        records = load_split(data, "test", check_images=False)
    except CaptionerError:
        return []
    return [r.path for r in records if r.stored is None and r.path.is_file()][:count]
