"""What a command needs (Java and the metrics, data files, the start checkpoint, a folder to write into), checked
before its work starts so it never stops midway; each refusal is one line naming the way out. A run folder without
an earlier run is training's own check (training/run_folders.py), which `train` makes first too."""

from __future__ import annotations

import os
from pathlib import Path

from captioner.apps.arguments import said_by_an_error
from captioner.core.config_sections import Config, DataConfig
from captioner.core.errors import CaptionerError, CheckpointError, ConfigError, DatasetError
from captioner.core.files import make_folder


def require_official_metrics(spice: bool = False) -> None:
    """`evaluate` without `--fast`: pycocoevalcap, a Java that starts, and with `--spice` SPICE's models."""
    import pycocoevalcap  # noqa: F401

    from captioner.evaluation.java import check_java
    from captioner.evaluation.spice_models import ensure_spice_models

    try:
        check_java()
    except CaptionerError as e:
        raise CaptionerError(f"{e}; or add --fast to score with the in-process BLEU and CIDEr-D") from None
    if spice:
        with said_by_an_error("captioner.evaluation.spice_models"):  # its warning is said by the refusal
            if not ensure_spice_models():
                raise CaptionerError("evaluate --spice: SPICE's Stanford CoreNLP models are not installed and could "
                                     "not be downloaded; run python -m pycocoevalcap.spice.get_stanford_models with "
                                     "internet access, or leave out --spice")


def require_data(data: DataConfig, splits: list[str], given_as: str = "data.root") -> None:
    """The dataset's caption files (or folder) for each split; `given_as`: how the user named data.root. The shapes
    world is generated on first use: its counts and size are checked and its folder is made now, so a world too
    large to draw or a root that cannot hold it is said before the work (and before the run's folder is made)."""
    from captioner.data.shapes import check_shapes_options, finished_world

    if data.dataset == "shapes" and not finished_world(data.root):
        check_shapes_options(data.shapes_num_train, data.shapes_num_val, data.shapes_num_test, data.image_size,
                             data.shapes_seed, "jpg", from_config=True)
        writable_folder(data.root, given_as)
    missing = next(filter(None, (missing_data(data, split, given_as) for split in splits)), None)
    if missing is not None:
        raise DatasetError(missing)


def missing_data(data: DataConfig, split: str, given_as: str = "data.root") -> str | None:
    """One line naming what `load_split(data, split)` would not find and how to get it, or None."""
    root = Path(data.root)
    download = f"captioner data {data.dataset} --root {data.root}"  # said for flickr8k and coco, which it fetches
    place, elsewhere = ((f"{given_as} {data.root}", f"give {given_as} DIR") if given_as.startswith("--")
                        else (f"{given_as}={data.root}", f"set {given_as}=DIR"))
    if data.dataset == "flickr8k":
        from captioner.data.flickr8k import TOKEN_FILE

        if not (root / TOKEN_FILE).is_file():
            return (f"{place}: no Flickr8k here ({TOKEN_FILE} not found); download it with {download}, "
                    f"or {elsewhere} where it is")
    elif data.dataset == "coco":
        from captioner.data.coco import coco_split_files

        annotations, _ = coco_split_files(root, data.year, split)
        if not annotations.is_file():
            return (f"{place}: no COCO {data.year} here ({annotations.relative_to(root)} not found); "
                    f"download it with {download} --year {data.year}, or {elsewhere} where it is")
    elif data.dataset == "karpathy":
        split_file = Path(data.karpathy_file) if data.karpathy_file is not None else None
        if split_file is not None and not split_file.is_file():
            fetch = (f"download it with captioner data coco --root {split_file.parent} --year {data.year} "
                     "--karpathy, or " if split_file.name == "dataset_coco.json" else "")  # others come with images
            return (f"data.karpathy_file={data.karpathy_file}: Karpathy split file not found; "
                    f"{fetch}set data.karpathy_file=FILE where it is")
    elif data.dataset == "imagefolder" and not root.is_dir():
        return (f"{root}: image folder not found; set data.root=DIR to a folder of images with metadata.jsonl "
                "or metadata.csv")
    elif data.dataset == "hf" and not root.exists():
        return f"{root}: Hugging Face dataset not found; set data.root to a save_to_disk folder or Parquet files"
    return None


def require_start(config: Config, resume: bool) -> None:
    """`train`: what the run starts from, before any data is read: --resume's last.pt, else train.init (SCST's)."""
    last = Path(config.train.out_dir) / "last.pt"
    if resume:
        from captioner.training.run_folders import require_resumable

        require_resumable(last)
        return
    init = config.train.init
    if init and not Path(init).exists():
        raise CheckpointError(f"train.init={init}: checkpoint not found (--init names the .pt a run starts from)")
    if init and Path(init).is_dir():
        raise CheckpointError(f"train.init={init}: a folder; name the checkpoint in it (--init {Path(init) / 'best.pt'}"
                              ", say)")
    if config.train.stage == "scst" and not init:
        raise ConfigError("train.stage: scst starts from a cross-entropy model: "
                          "set train.init (or pass --init CHECKPOINT)")


def writable_folder(folder: str | Path, given_as: str) -> None:
    """Make the folder a command writes into now, so a place that cannot be written (or an empty name) is said
    before the work starts; `given_as`: the option or key that named it."""
    if not str(folder).strip():  # Path("") is the current folder: its files would be written beside
        raise CaptionerError(f"{given_as}: an empty name; give the folder to write into")
    path = Path(folder)
    said = f"{given_as}={path}" if given_as.startswith(("data.", "train.")) else f"{given_as} {path}"
    make_folder(path, said, CaptionerError)
    if not os.access(path, os.W_OK):
        raise CaptionerError(f"{said}: this folder is not writable")
