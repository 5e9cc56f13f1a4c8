"""The folders a training run makes as it starts, seen before its work: those it keeps in train.out_dir (its
TensorBoard events) and data.feature_store, when the user places the store. A file where one goes, or a place below
a file, is said in one line, and the file is left as it is."""

from __future__ import annotations

import os
from pathlib import Path

from captioner.core.config_sections import Config
from captioner.core.errors import FeatureStoreError, StorageError
from captioner.core.files import folder_problem

RUN_FOLDERS = {"tensorboard": "its TensorBoard events"}  # made in train.out_dir by every run's rank 0
# The files every run writes in train.out_dir: a folder of one of these names would fail its first write, an epoch in
RUN_FILES = ("best.pt", "last.pt", "metrics.csv", "vocab.json", "config.yaml")


def check_run_folders(config: Config) -> None:
    """Refuse, in one line, a file in train.out_dir named as a folder every run makes there (RUN_FOLDERS), a folder
    named as a file it writes there (RUN_FILES), or a data.feature_store that is a file or lies below one; seen
    without making anything. (The default store in train.out_dir, made only by a run that uses it, and a place the
    OS refuses for other reasons, are said when the store's folder is made, before any image is encoded.)"""
    out_dir = Path(config.train.out_dir)
    for name, what in RUN_FOLDERS.items():
        if os.path.lexists(out_dir / name) and not (out_dir / name).is_dir():
            raise StorageError(f"train.out_dir={out_dir}: {name} is a file, where the run keeps {what} in a "
                               f"folder; move it, or set another train.out_dir")
    for name in RUN_FILES:
        if (out_dir / name).is_dir():
            raise StorageError(f"train.out_dir={out_dir}: {name} is a folder, where the run writes its {name}; move "
                               "it, or set another train.out_dir")
    store = config.data.feature_store if config.train.cache_features else None
    problem = folder_problem(Path(store)) if store else None
    if problem is not None:
        raise FeatureStoreError(f"data.feature_store={store}: {problem}")
