"""The error contract of the `captioner` command, walked command by command.

A user's mistake (a missing or wrong path, an unreadable image or checkpoint, a bad config key
or value, a missing argument, a missing prerequisite: Java, an extra's package, a data folder) is
one line on stderr and exit status 2, said before the work starts and naming the way out. A
partial failure (some images captioned, some not) names each failure and ends with a summary
line, exit status 1. The table below holds a row per mistake; a command of the parser without a
row fails `test_every_command_has_rows`.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, require_module, subprocess_env, tiny_config, tiny_model
from PIL import Image
import warm_start

from captioner.apps.cli import build_parser, main
from captioner.models.checkpoint import save_checkpoint

CONFIGS = REPO / "configs"
BUSY: list[socket.socket] = []  # listening sockets the module's rows find their ports taken by


@dataclass(frozen=True)
class Row:
    """`captioner ARGV` in an empty working folder, after `setup`, exits with `code`; for 2 its
    only line matches `line`, for 1 its last line does. Words in braces name the `world` files."""

    argv: list[str]
    code: int
    line: str
    setup: tuple[str, ...] = field(default=())


# What must not run before a command has refused: the work each command does.
WORK = {
    "train": "captioner.apps.commands.train.train_run",
    "features": "captioner.data.store_extract.ensure_store",
    "evaluate": "captioner.evaluation.evaluate.evaluate",
    "data shapes": "captioner.data.shapes.generate_shapes",
    "data shards": "captioner.data.datasets.load_split",  # a shapes config's world is generated there
}

FLICKR8K = str(CONFIGS / "flickr8k_lstm_lite0.yaml")
SHAPES = str(CONFIGS / "shapes_lstm.yaml")

ROWS: dict[str, Row] = {
    # the command line itself
    "no command": Row([], 2, r"^error: captioner: name a command: data, train, features, caption"),
    "unknown command": Row(["nosuch"], 2, r"^error: captioner: argument command: invalid choice: 'nosuch'"),
    "unknown option": Row(["caption", "{model}", "{image}", "--no-such-flag"], 2,
                          r"^error: captioner: unrecognized arguments: --no-such-flag"),
    # data
    "data: no subcommand": Row(["data"], 2,
                               r"^error: captioner data: name a command: shapes, coco, flickr8k, stats, shards$"),
    "data shapes: no --out": Row(["data", "shapes"], 2,
                                 r"^error: captioner data shapes: the following arguments are required: --out$"),
    "data shapes: --out a file": Row(["data", "shapes", "--out", "{image}"], 2,
                                     r"^error: data shapes --out .*good\.png: a file, not a folder"),
    "data shapes: --out a folder of other files": Row(["data", "shapes", "--out", "{full}"], 2,
                                                      r"^error: data shapes --out .*full: not empty and not a shapes "),
    "data shapes: an empty --out": Row(["data", "shapes", "--out", ""], 2,
                                       r"^error: data shapes --out: an empty name; give the folder to write into$"),
    "data shapes: bad number": Row(["data", "shapes", "--out", "d", "--num-train", "many"], 2,
                                   r"argument --num-train: invalid int value: 'many'"),
    "data shapes: a negative seed": Row(["data", "shapes", "--out", "d", "--seed", "-1"], 2,
                                        r"^error: seed must be in \[0, 4294967296\) \(numpy's seed range"),
    "data shapes: images past data.image_size's": Row(["data", "shapes", "--out", "d", "--image-size", "100000"], 2,
                                                      r"^error: image size must be in \[32, 4096\] pixels"),
    "data coco: no --root": Row(["data", "coco"], 2,
                                r"^error: captioner data coco: the following arguments are required: --root$"),
    "data coco: --root a file": Row(["data", "coco", "--root", "{image}"], 2,
                                    r"good\.png: a file, not a folder to download into$"),
    "data coco: bad year": Row(["data", "coco", "--root", "d", "--year", "2015"], 2,
                               r"argument --year: invalid choice: 2015"),
    "data coco: offline": Row(["data", "coco", "--root", "d", "--mirror", "http://127.0.0.1:9"], 2,
                              r"^error: cannot reach 127\.0\.0\.1:9: no internet\? .* while downloading "
                              r"http://127\.0\.0\.1:9/zips/train2014\.zip; or fetch it by hand, save it as "
                              r"d/downloads/train2014\.zip and run this again$",
                              ("no_backoff",)),
    "data flickr8k: no --root": Row(["data", "flickr8k"], 2,
                                    r"^error: captioner data flickr8k: the following arguments are required: --root$"),
    "data flickr8k: --root a file": Row(["data", "flickr8k", "--root", "{image}"], 2,
                                        r"good\.png: a file, not a folder to download into$"),
    "data flickr8k: offline": Row(["data", "flickr8k", "--root", "d", "--mirror", "http://127.0.0.1:9"], 2,
                                  r"^error: cannot reach 127\.0\.0\.1:9: .*Flickr8k_text\.zip; or fetch it by hand, "
                                  r"save it as d/downloads/Flickr8k_text\.zip and run this again$", ("no_backoff",)),
    "data stats: nothing to describe": Row(["data", "stats"], 2,
                                           r"^error: data stats: give --coco FILE, --karpathy FILE"),
    "data stats: missing file": Row(["data", "stats", "--coco", "missing.json"], 2,
                                    r"^error: missing\.json: caption annotation file not found$"),
    "data stats: broken file": Row(["data", "stats", "--coco", "{broken_json}"], 2, r"broken\.json: not valid JSON"),
    "data stats: config without its data": Row(["data", "stats", FLICKR8K, "data.root=nowhere"], 2,
                                               (r"^error: data\.root=nowhere: no Flickr8k here .*download it with "
                                                r"captioner data flickr8k --root nowhere")),
    "data stats: no Flickr8k in the folder": Row(["data", "stats", "--flickr8k", "nowhere"], 2,
                                                 (r"^error: --flickr8k nowhere: no Flickr8k here .*captioner data "
                                                  r"flickr8k --root nowhere, or give --flickr8k DIR")),
    "data stats: a count below 1": Row(["data", "stats", "--coco", "c.json", "--min-count", "-5"], 2,
                                       r"argument --min-count: must be at least 1, got -5"),  # data.min_word_count's
    "data stats: a folder as the config": Row(["data", "stats", "{empty}"], 2,
                                              r"^error: .*empty: config file is a folder, not a file$"),
    "data shards: nothing to write": Row(["data", "shards", "--out", "s"], 2,
                                         r"^error: data shards: give --flickr8k DIR"),
    "data shards: no --out": Row(["data", "shards", SHAPES], 2, r"the following arguments are required: --out$"),
    "data shards: bad splits": Row(["data", "shards", SHAPES, "--out", "s", "--splits", "dev"], 2,
                                   r"^error: data shards --splits: dev is not a split; use train,val,test$"),
    "data shards: --out a file": Row(["data", "shards", SHAPES, "--out", "{image}"], 2,
                                     r"^error: data shards --out .*good\.png: a file, not a folder to write into$"),
    "data shards: an empty --out": Row(["data", "shards", SHAPES, "--out", ""], 2,
                                       r"^error: data shards --out: an empty name; give the folder to write into$"),
    "data shards: a --max-size of nan": Row(["data", "shards", SHAPES, "--out", "s", "--max-size", "nan"], 2,
                                            r"^error: data shards --max-size nan: must be a finite number of bytes"),
    "data shards: an infinite --max-size": Row(["data", "shards", SHAPES, "--out", "s", "--max-size", "inf"], 2,
                                               r"^error: data shards --max-size inf: must be a finite number"),
    "data shards: a split named twice": Row(["data", "shards", SHAPES, "--out", "s", "--splits", "test,val,test"], 2,
                                            r"--splits test,val,test: names test twice; name each split once$"),
    "data shards: config without its data": Row(["data", "shards", FLICKR8K, "data.root=nowhere", "--out", "s"], 2,
                                                (r"data\.root=nowhere: no Flickr8k here .*captioner data flickr8k "
                                                 r"--root nowhere")),
    # config
    "data shards: no Flickr8k in the folder": Row(["data", "shards", "--flickr8k", "nowhere", "--out", "s"], 2,
                                                  (r"^error: --flickr8k nowhere: no Flickr8k here .*captioner data "
                                                   r"flickr8k --root nowhere")),
    "config: no subcommand": Row(["config"], 2, r"^error: captioner config: name a command: show, keys$"),
    "config show: missing file": Row(["config", "show", "missing.yaml"], 2,
                                     r"^error: missing\.yaml: config file not found$"),
    "config show: broken YAML": Row(["config", "show", "{broken_yaml}"], 2, r"broken\.yaml: not valid YAML"),
    "config show: a folder": Row(["config", "show", "{empty}"], 2,
                                 r"^error: .*empty: config file is a folder, not a file$"),
    "config show: a photo": Row(["config", "show", "{image}"], 2,
                                r"^error: .*good\.png: config file is not UTF-8 text \(invalid start byte at byte 0"),
    "config show: unknown key": Row(["config", "show", "train.epochz=3"], 2,
                                    r"unknown key 'train\.epochz' \(did you mean 'train\.epochs'\?\)$"),
    "config show: bad value": Row(["config", "show", "train.epochs=many"], 2,
                                  r"'train\.epochs' must be int; got 'many'$"),
    "config keys: no such key": Row(["config", "keys", "zzz"], 2, r"^error: no config key starts with 'zzz'"),
    # train
    "train: no config": Row(
        ["train"], 2, r"^error: captioner train: give a config, e.g\. captioner train configs/shapes_lstm\.yaml$"),
    "train: missing config": Row(["train", "missing.yaml"], 2, r"^error: missing\.yaml: config file not found$"),
    "train: broken YAML": Row(["train", "{broken_yaml}"], 2, r"broken\.yaml: not valid YAML"),
    "train: unknown key": Row(["train", SHAPES, "train.epochz=3"], 2,
                              r"unknown key 'train\.epochz' \(did you mean 'train\.epochs'\?\)$"),
    "train: bad value": Row(["train", SHAPES, "train.lr=.nan"], 2,
                            r"'train\.lr' must be a finite number > 0; got nan$"),
    "train: bad device": Row(["train", SHAPES, "--device", "gpu"], 2, r"train\.device"),
    "train: missing --init": Row(["train", SHAPES, "--init", "missing.pt"], 2,
                                 r"^error: train\.init=missing\.pt: checkpoint not found"),
    "train: an empty --init": Row(["train", SHAPES, "--init", ""], 2,
                                  r"^error: train --init: an empty path; name the checkpoint to start from"),
    "train: nothing to resume": Row(["train", SHAPES, "--resume"], 2,
                                    r"last\.pt: nothing to resume .*leave out --resume"),
    "train: --resume of a last.pt that links to itself": Row(
        ["train", SHAPES, "train.out_dir=run", "--resume"], 2,
        r"^error: run/last\.pt: a link that leads to no file \(a loop, or its target gone\)", ("a_last_pt_loop",)),
    "train: an out_dir that holds a run": Row(
        ["train", SHAPES, "train.out_dir=run"], 2,
        (r"^error: train\.out_dir=run already holds a run \(best\.pt, last\.pt\): continue it with --resume, or "
         r"give another train\.out_dir \(or delete it\)$"), ("a_run",)),
    "train: an out_dir that holds a best.pt alone": Row(
        ["train", SHAPES, "train.out_dir=run"], 2,
        r"^error: train\.out_dir=run already holds a run \(best\.pt\): give another train\.out_dir \(or delete it\)$",
        ("a_run_without_last",)),
    "train: an out_dir that cannot be made": Row(["train", SHAPES, "train.out_dir={image}/run"], 2,
                                                 r"^error: train\.out_dir=.*good\.png/run: cannot create the folder"),
    "train: a shapes data.root that is a file": Row(["train", SHAPES, "data.root={image}"], 2,
                                                    r"^error: data\.root=.*good\.png: a file, not a folder to write "
                                                    r"into$"),
    "train: a shapes data.root that cannot be made": Row(["train", SHAPES, "data.root={image}/shapes"], 2,
                                                         (r"^error: data\.root=.*good\.png/shapes: cannot create the "
                                                          r"folder \(Not a directory\)$")),
    "train: a shapes world below 32 pixels": Row(["train", SHAPES, "data.image_size=16"], 2,
                                                 r"^error: command line: 'data\.image_size' 16 is too small for the "
                                                 r"shapes world \(at least 32 pixels"),
    "train: a data.feature_store that is a file": Row(["train", SHAPES, "data.feature_store={image}"], 2,
                                                      (r"^error: data\.feature_store=.*good\.png: a file, not a "
                                                       r"folder to write into$")),
    "train: a data.feature_store below a file": Row(["train", SHAPES, "data.feature_store={image}/store"], 2,
                                                    (r"^error: data\.feature_store=.*good\.png/store: cannot create "
                                                     r"the folder \(Not a directory\)$")),
    "train: a folder where the run writes a file": Row(
        ["train", SHAPES, "train.out_dir={folders_run}"], 2,
        r"^error: train\.out_dir=.*folders_run: last\.pt is a folder, where the run writes its last\.pt; move it"),
    "train: --resume from a last.pt that is a folder": Row(
        ["train", SHAPES, "train.out_dir={folders_run}", "--resume"], 2,
        r"^error: .*folders_run/last\.pt: a folder, not the checkpoint --resume continues from$"),
    "train: --init a folder": Row(["train", SHAPES, "--init", "{empty}"], 2,
                                  r"^error: train\.init=.*empty: a folder; name the checkpoint in it \(--init "),
    "train: a file named tensorboard in train.out_dir": Row(
        ["train", SHAPES, "train.out_dir={tensorboard_run}"], 2,
        (r"^error: train\.out_dir=.*tensorboard_run: tensorboard is a file, where the run keeps its TensorBoard "
         r"events in a folder; move it, or set another train\.out_dir$")),
    "train: no Flickr8k": Row(["train", FLICKR8K, "data.root=nowhere"], 2,
                              r"^error: data\.root=nowhere: no Flickr8k here \(Flickr8k\.token\.txt not found\); "
                              r"download it with captioner data flickr8k --root nowhere, or set data\.root=DIR"),
    "train: no COCO": Row(["train", str(CONFIGS / "coco_lstm_resnet101.yaml")], 2,
                          (r"data\.karpathy_file=data/coco/dataset_coco\.json: .*captioner data coco --root data/coco "
                           r"--year 2014 --karpathy")),
    "train: no image folder": Row(["train", str(CONFIGS / "imagefolder_lstm_lite0.yaml"), "data.root=nowhere"], 2,
                                  r"nowhere: image folder not found; set data\.root=DIR"),
    # features
    "features: no config": Row(["features"], 2,
                               r"^error: captioner features: give a config, e\.g\. captioner features configs/"),
    "features: bad splits": Row(["features", SHAPES, "--splits", "dev"], 2, r"features --splits: dev is not a split"),
    "features: an empty split name": Row(["features", SHAPES, "--splits", "train,,val"], 2,
                                         r"^error: features --splits: '' is not a split; use train,val,test$"),
    "features: a split named twice": Row(["features", SHAPES, "--splits", "train,train"], 2,
                                         r"^error: features --splits train,train: names train twice; name each"),
    "features: an --out that is a file": Row(["features", SHAPES, "--out", "{image}"], 2,
                                             r"^error: features --out .*good\.png: a file, not a folder to write "
                                             r"into$"),
    "features: an --out below a file": Row(["features", SHAPES, "--out", "{image}/store"], 2,
                                           (r"^error: features --out .*good\.png/store: cannot create the folder "
                                            r"\(Not a directory\)$")),
    "features: no Flickr8k": Row(["features", FLICKR8K, "data.root=nowhere"], 2,
                                 r"data\.root=nowhere: no Flickr8k here .*captioner data flickr8k"),
    # caption
    "caption: nothing": Row(["caption"], 2, r"^error: caption: no images given$"),
    "caption: a missing image": Row(["caption", "missing.jpg"], 2, r"^error: missing\.jpg: no such file$"),
    "caption: only missing images": Row(["caption", "{model}", "missing.jpg", "gone.png"], 2,
                                        r"^error: caption: none of the 2 images exist \(e\.g\. missing\.jpg\)$"),
    "caption: an unreadable image": Row(["caption", "{model}", "{bad_image}"], 2,
                                        r"^error: .*bad\.jpg: not an image file"),
    "caption: only unreadable images": Row(["caption", "{model}", "{bad_image}", "{bad_image}"], 2,
                                           r"^error: caption: none of the 2 images could be read"),
    "caption: a folder without images": Row(["caption", "{model}", "{empty}"], 2,
                                            r"^error: caption: no images in .*empty$"),
    "caption: a model without images": Row(["caption", "{model}"], 2,
                                           r"^error: caption: no images given after the model"),
    "caption: missing model": Row(["caption", "missing.pt", "missing.jpg"], 2,
                                  r"^error: missing\.pt: checkpoint not found"),
    "caption: truncated model": Row(["caption", "{truncated}", "{image}"], 2,
                                    r"truncated\.pt: not a readable captioner checkpoint"),
    "caption: bad beam": Row(["caption", "{model}", "{image}", "--beam", "0"], 2,
                             r"argument --beam: beam_size must be a whole number"),
    "caption: a search flag with --sample": Row(["caption", "{model}", "{image}", "--sample", "--diverse-groups",
                                                 "3"], 2, r"^error: caption: --diverse-groups shapes the beam search, "
                                                          r"and --sample draws each word instead"),
    "caption: --attention without --json": Row(["caption", "{model}", "{image}", "--attention"], 2,
                                               r"^error: caption: --attention adds each word's map to the JSON; "
                                               r"give --json too$"),
    "caption: a device captioner does not run on": Row(["caption", "{model}", "{image}", "--device", "meta"], 2,
                                                       r"^error: --device: 'meta' is not a device captioner runs on "
                                                       r"\(auto, cpu, mps, cuda or cuda:N\)$"),
    "caption: sampling flag without --sample": Row(["caption", "{model}", "{image}", "--top-k", "5"], 2,
                                                   r"--top-k applies only with --sample$"),
    "caption: no onnxruntime": Row(["caption", "{empty}", "{image}", "--runtime", "onnx"], 2,
                                   r"^error: onnxruntime is not installed: it comes with the 'onnx' extra",
                                   ("no_onnxruntime",)),
    "caption: a layer the model lacks": Row(["caption", "{model}", "{image}", "--json", "--attention", "--layer", "3"],
                                            2,
                                            r"^error: caption --layer 3: this model's maps have 1 layer"),
    "caption: a head the model lacks": Row(["caption", "{model}", "{image}", "--heatmaps", "maps", "--head", "4"], 2,
                                           r"^error: caption --head 4: this model's maps have 1 head"),
    "caption: a figure folder that cannot be made": Row(["caption", "{model}", "{image}", "--heatmaps", "{image}"], 2,
                                                        (r"^error: caption --heatmaps .*good\.png: a file, not a "
                                                         r"folder to write into$"), ("no_caption",)),
    "caption: some images fail": Row(["caption", "{model}", "{image}", "{bad_image}", "missing.jpg"], 1,
                                     r"^2 of 3 images failed$"),
    # evaluate
    "evaluate: nothing": Row(["evaluate"], 2,
                             r"^error: evaluate: give a CHECKPOINT, or --results FILE --annotations FILE$"),
    "evaluate: missing model": Row(["evaluate", "missing.pt", "--fast"], 2,
                                   r"^error: missing\.pt: checkpoint not found"),
    "evaluate: truncated model": Row(["evaluate", "{truncated}", "--fast"], 2,
                                     r"truncated\.pt: not a readable captioner checkpoint"),
    "evaluate: results alone": Row(["evaluate", "--results", "r.json"], 2, r"--results and --annotations go together$"),
    "evaluate: missing results": Row(["evaluate", "--fast", "--results", "missing.json", "--annotations",
                                      "{broken_json}"], 2, r"broken\.json: not valid JSON"),
    "evaluate: no Java": Row(["evaluate", "{model}"], 2,
                             (r"^error: Java not found: .*need Java 17.*apt-get install openjdk-17-jre-headless.*; or "
                              r"add --fast"), ("no_java", "no_model")),
    "evaluate: no Java for a results file": Row(["evaluate", "--results", "missing.json", "--annotations",
                                                 "missing.json"], 2,
                                                r"^error: Java not found: .*or add --fast", ("no_java",)),
    "evaluate: no metrics package": Row(["evaluate", "{model}"], 2,
                                        (r"^error: pycocoevalcap is not installed: it comes with the 'train' extra "
                                         r"\(pip install 'captioner\[train\]'"),
                                        ("no_pycocoevalcap", "no_model")),
    "evaluate: no SPICE models": Row(["evaluate", "{model}", "--spice"], 2,
                                     (r"^error: evaluate --spice: SPICE's Stanford CoreNLP models are not installed "
                                      r".*or leave out --spice$"),
                                     ("no_spice_models", "no_model")),
    "evaluate: the model's data is not here": Row(["evaluate", "{flickr8k_model}", "--fast"], 2,
                                                  (r"^error: data\.root=data/flickr8k: no Flickr8k here .*captioner "
                                                   r"data flickr8k --root data/flickr8k")),
    "evaluate: the images are gone": Row(["evaluate", "{shapes_model}", "--fast"], 2,
                                         (r"captions_test\.json: none of the 1 images listed exist under .*; point "
                                          r"data\.root"), ("shapes_without_images",)),
    "evaluate: a place the model may not name": Row(["evaluate", "{elsewhere_model}", "--fast"], 2,
                                                    r"name the data yourself \(data\.root=\.\.\.\)$"),
    "evaluate: negative limit": Row(["evaluate", "{model}", "--fast", "--limit", "-2"], 2,
                                    r"argument --limit: must be at least 0, got -2"),
    "evaluate: an --out that cannot be made": Row(["evaluate", "{model}", "--fast", "--out", "{image}/eval"], 2,
                                                  r"^error: evaluate --out .*good\.png/eval: cannot create the folder",
                                                  ("shapes_world",)),
    "evaluate: --saliency without --grounding": Row(["evaluate", "{model}", "--fast", "--saliency", "gradcam"], 2,
                                                    r"it needs --grounding$"),
    "evaluate: --heatmaps without --grounding": Row(["evaluate", "{model}", "--fast", "--heatmaps", "maps"], 2,
                                                    r"^error: evaluate: --heatmaps draws .* it needs --grounding$"),
    "evaluate: --spice with --fast": Row(["evaluate", "{model}", "--fast", "--spice"], 2,
                                         r"^error: evaluate: --spice is one of the official metrics, and --fast "),
    "evaluate: a --heatmaps folder that is a file": Row(
        ["evaluate", "{model}", "--fast", "--grounding", "--heatmaps", "{image}"], 2,
        r"^error: evaluate --heatmaps .*good\.png: a file, not a folder to write into$", ("shapes_world",)),
    "evaluate: a grounding layer the model lacks": Row(["evaluate", "{model}", "--fast", "--grounding", "--layer", "9"],
                                                       2,
                                                       (r"^error: evaluate --layer 9: this model's maps have 1 layer "
                                                        r"\(0 to 0; -1 is the last\)$"),
                                                       ("shapes_world",)),
    "evaluate: a grounding head the model lacks": Row(["evaluate", "{model}", "--fast", "--grounding", "--head", "2"],
                                                      2,
                                                      (r"^error: evaluate --head 2: this model's maps have 1 head \(0 "
                                                       r"to 0\)$"), ("shapes_world",)),
    # export and push
    "export: nothing": Row(
        ["export"], 2, r"^error: captioner export: give a checkpoint and the folder to write, e\.g\. captioner export"),
    "export: missing model": Row(["export", "missing.pt", "out"], 2, r"^error: missing\.pt: checkpoint not found"),
    "export: truncated model": Row(["export", "{truncated}", "out"], 2,
                                   r"truncated\.pt: not a readable captioner checkpoint"),
    "export: a folder that holds other files": Row(["export", "{model}", "{full}"], 2,
                                                   r"full: not empty .*and not an export"),
    "export: a file where a folder of its path goes": Row(
        ["export", "{model}", "{image}/sub"], 2, r"good\.png/sub: cannot create the folder \(Not a directory\)$"),
    "export: missing figure image": Row(["export", "{model}", "out", "--image", "missing.jpg"], 2,
                                        r"^error: missing\.jpg: no such file$"),
    "export: no onnx package": Row(["export", "{model}", "out", "--onnx", "--image", "{image}"], 2,
                                   r"^error: onnx is not installed: it comes with the 'onnx' extra",
                                   ("no_onnx", "nothing_written")),
    "push: nothing": Row(["push"], 2, r"^error: captioner push: give a model and a Hub repo id, e\.g\. captioner push"),
    "push: bad repo id": Row(["push", "{model}", "nobody"], 2,
                             r"^error: push: 'nobody' is not a Hub repo id \(owner/name\)$"),
    "push: offline": Row(["push", "{model}", "someone/model"], 2,
                         r"^error: push someone/model: offline \(HF_HUB_OFFLINE is set\)", ("offline",)),
    # demo
    "demo: missing model": Row(["demo", "missing.pt"], 2, r"^error: missing\.pt: checkpoint not found"),
    "demo: examples without images": Row(["demo", "{model}", "--examples", "{empty}"], 2,
                                         r"^error: demo --examples: no images in .*empty$"),
    "demo: a missing example": Row(["demo", "{model}", "--examples", "missing.jpg"], 2,
                                   r"^error: demo --examples: missing\.jpg: no such file$"),
    "demo: bad port": Row(["demo", "{model}", "--port", "70000"], 2,
                          r"argument --port: a port is at most 65535, got 70000"),
    "demo: a port in use": Row(["demo", "{model}", "--port", "{busy_port}"], 2,
                               (r"^error: demo --port \d+: port \d+ on 127\.0\.0\.1 is in use \(another demo\?\); give "
                                r"another with --port$"),
                               ("no_demo_model",)),
    "demo: no Gradio": Row(["demo", "{model}"], 2, r"^error: (demo: Gradio|gradio) is not installed.*\[demo\]",
                           ("no_gradio",)),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The files the rows name: tiny checkpoints (one whole, one cut short, three whose stored
    data sections point where nothing is), images good and bad, broken files, folders."""
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("world")
    files = {name: root / name for name in ("model.pt", "good.png", "bad.jpg", "truncated.pt", "broken.json",
                                            "broken.yaml", "empty", "full")}
    save_checkpoint(files["model.pt"], tiny_model("decode.max_length=4"))
    Image.fromarray(np.full((20, 24, 3), 90, dtype=np.uint8)).save(files["good.png"])
    files["bad.jpg"].write_bytes(b"not an image")
    files["truncated.pt"].write_bytes(files["model.pt"].read_bytes()[:5000])
    files["broken.json"].write_text("{")
    files["broken.yaml"].write_text("train: [1\n")
    files["empty"].mkdir()
    files["tensorboard_run"] = root / "tensorboard_run"  # a run folder holding a file where its events' folder goes
    files["tensorboard_run"].mkdir()
    (files["tensorboard_run"] / "tensorboard").write_text("mine")
    files["folders_run"] = root / "folders_run"  # a run folder holding folders where its files go
    for name in ("last.pt", "metrics.csv"):
        (files["folders_run"] / name).mkdir(parents=True)
    files["full"].mkdir()
    (files["full"] / "notes.txt").write_text("mine")
    stored = {"flickr8k_model": ["data.dataset=flickr8k", "data.root=data/flickr8k"],
              "shapes_model": ["data.dataset=shapes", "data.root=shapes"],
              "elsewhere_model": [f"data.root={root / 'elsewhere'}"]}  # absolute, and not where its run wrote it
    BUSY.append(socket.create_server(("127.0.0.1", 0)))  # a port another process serves on, for this module's rows
    paths = {name: str(path) for name, path in files.items()} | {"busy_port": str(BUSY[-1].getsockname()[1])}
    paths |= {"model": paths["model.pt"], "image": paths["good.png"], "bad_image": paths["bad.jpg"],
              "truncated": paths["truncated.pt"],
              "broken_json": paths["broken.json"], "broken_yaml": paths["broken.yaml"]}
    for name, overrides in stored.items():
        save_checkpoint(root / f"{name}.pt", tiny_model("decode.max_length=4"),
                        tiny_config("decode.max_length=4", *overrides))
        paths[name] = str(root / f"{name}.pt")
    return paths


def prepare(setup: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """The prerequisite a row takes away, or the files it leaves half there."""
    if "no_java" in setup:
        (folder / "bin").mkdir()
        monkeypatch.setenv("PATH", str(folder / "bin"))  # no java on it
    if "no_model" in setup:  # the check must come before the model loads, let alone captions
        monkeypatch.setattr("captioner.apps.commands.evaluate.load_model",
                            refuse("a model loaded before the prerequisites were checked"))
    if "no_spice_models" in setup:  # offline, and never downloaded: the library warns and scores without SPICE
        def offline() -> bool:
            logging.getLogger("captioner.evaluation.spice_models").warning(
                "SPICE skipped: the Stanford CoreNLP 3.6.0 models are not here")
            return False

        monkeypatch.setattr("captioner.evaluation.spice_models.ensure_spice_models", offline)
    if "no_caption" in setup:  # the folder is checked before the model loads
        monkeypatch.setattr("captioner.apps.commands.caption.load_model",
                            refuse("a model loaded before the figure folder was checked"))
    if "shapes_world" in setup:  # the model's data, there: one image a split
        shapes_world(folder / "data" / "shapes", with_images=True)
    if "no_pycocoevalcap" in setup:
        # import raises ModuleNotFoundError, as when the extra is left out
        monkeypatch.setitem(sys.modules, "pycocoevalcap", None)
    if "no_demo_model" in setup:  # the port is checked before any model loads
        require_module("gradio", "the demo extra is not installed")
        monkeypatch.setattr("captioner.apps.demo.cards.load_captioner",
                            refuse("a model loaded before the port was checked"))
    if "no_gradio" in setup:
        monkeypatch.setitem(sys.modules, "gradio", None)
        forget_module(monkeypatch, "captioner.apps.demo.server")
    if "no_onnx" in setup:
        monkeypatch.setitem(sys.modules, "onnx", None)
    if "nothing_written" in setup:  # the check comes before the Hub layout is written
        monkeypatch.setattr("captioner.apps.export.export_model",
                            refuse("export wrote files before checking its prerequisites"))
    if "no_onnxruntime" in setup:
        monkeypatch.setitem(sys.modules, "onnxruntime", None)
        forget_module(monkeypatch, "captioner.deploy.runtime")  # an earlier test may have imported it
    if "offline" in setup:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if "no_backoff" in setup:  # a download's retries at once: what they say is the point, not their pace
        monkeypatch.setattr("captioner.data.download.RETRY_BACKOFF_S", 0.0)
    if "a_run" in setup or "a_run_without_last" in setup:  # an earlier run in train.out_dir=run
        earlier_run(folder / "run", last="a_run" in setup)
    if "a_last_pt_loop" in setup:  # said "nothing to resume (no last.pt ...)", with a last.pt in the folder
        (folder / "run").mkdir()
        (folder / "run" / "last.pt").symlink_to("last.pt")
    if "shapes_without_images" in setup:  # a moved run: its caption files are there, its images are not
        shapes_world(folder / "shapes", with_images=False)


def forget_module(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Have the test import module `name` afresh; afterwards the module it replaced is back in sys.modules
    and as its package's attribute alike. (Put back in sys.modules alone, the package kept the test's
    module: a later `from package import module` patched another object than the command used.)"""
    parent, _, child = name.rpartition(".")
    package = sys.modules.get(parent)
    if package is not None and hasattr(package, child):
        monkeypatch.setattr(package, child, getattr(package, child))  # recorded: put back after the test
    monkeypatch.delitem(sys.modules, name, raising=False)


def shapes_world(root: Path, with_images: bool) -> None:
    """A shapes world of one image a split, in COCO format (with its image files or without)."""
    for split in ("train", "val", "test"):
        (root / split).mkdir(parents=True)
        listing = {"images": [{"id": 1, "file_name": f"{split}_1.jpg"}],
                   "annotations": [{"id": 1, "image_id": 1, "caption": "a red circle"}]}
        (root / f"captions_{split}.json").write_text(json.dumps(listing))
        if with_images:
            Image.fromarray(np.full((32, 32, 3), 200, dtype=np.uint8)).save(root / split / f"{split}_1.jpg")


def earlier_run(run: Path, last: bool = True) -> dict[str, bytes]:
    """A finished run's files in `run` (its best.pt, with last.pt or without), as {name: bytes}."""
    run.mkdir(parents=True)
    files = {"best.pt": b"the earlier run's best", "metrics.csv": b"epoch,step\n1,4\n", "vocab.json": b"{}"}
    if last:
        files["last.pt"] = b"the earlier run's last"
    for name, data in files.items():
        (run / name).write_bytes(data)
    return files


def refuse(what: str):
    def stop(*args: object, **kwargs: object) -> None:
        raise AssertionError(what)

    return stop


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str],
            caplog: pytest.LogCaptureFixture) -> tuple[int, list[str]]:
    """`captioner ARGV` in-process: its exit status, and the lines a user sees on stderr (printed,
    and logged at WARNING or above; the info lines of its progress are the command's output)."""
    with caplog.at_level(logging.WARNING):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's refusals
            code = e.code
    err = capsys.readouterr().err
    logged = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    return int(code or 0), [line for line in err.splitlines() if line.strip()] + logged


@pytest.mark.parametrize("name", list(ROWS))
def test_a_mistake_is_one_line_and_exit_2_a_partial_failure_a_summary_and_exit_1(
    name: str, world: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    row = ROWS[name]
    monkeypatch.chdir(tmp_path)
    argv = [re.sub(r"\{(\w+)\}", lambda m: world[m.group(1)], word) for word in row.argv]
    if row.code == 2:  # a refusal comes before the command's work
        command = " ".join(row.argv[:2]) if row.argv[:1] == ["data"] else " ".join(row.argv[:1])
        if command in WORK:
            monkeypatch.setattr(WORK[command], refuse(f"{command} started its work before refusing"))
    prepare(row.setup, monkeypatch, tmp_path)
    code, lines = run_cli(argv, capsys, caplog)
    assert code == row.code, (code, lines)
    assert not any("Traceback" in line for line in lines), lines
    if row.code == 2:
        assert len(lines) == 1, lines
    assert re.search(row.line, lines[-1]), lines


def test_a_shapes_root_that_cannot_hold_the_world_is_said_before_the_run_folder_is_made(
        world: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """train.out_dir is made only once the data can be: a refused data.root leaves no empty run folder behind."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(WORK["train"], refuse("train started its work before refusing"))
    for root in (world["image"], f"{world['image']}/shapes"):
        code, lines = run_cli(["train", SHAPES, f"data.root={root}", "train.out_dir=run"], capsys, caplog)
        assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: data.root={root}: "), lines
        assert not (tmp_path / "run").exists()


def test_fit_refuses_a_file_named_tensorboard_in_its_folder_before_any_work(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process too: `fit` says a file named tensorboard in train.out_dir in one line before it reads any data,
    and leaves the file as it was (before, the TensorBoard writer's FileExistsError once the run was set up)."""
    from captioner.core.errors import StorageError
    from captioner.training import fit as fitting

    monkeypatch.setattr(fitting, "load_records", refuse("fit read its data before refusing"))
    (tmp_path / "tensorboard").write_text("mine")
    with pytest.raises(StorageError, match=r"^train\.out_dir=.*: tensorboard is a file, where the run keeps its "
                                           r"TensorBoard events in a folder"):
        fitting.fit(tiny_config(f"train.out_dir={tmp_path}", "train.device=cpu"))
    assert (tmp_path / "tensorboard").read_text() == "mine"


def command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command the parser has, as the words that name it: ("train",), ("data", "shapes"), ..."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += command_paths(sub, (*path, name)) or [(*path, name)]
    return found


def test_a_forgotten_module_comes_back_in_sys_modules_and_on_its_package() -> None:
    """What the rows without Gradio undo: in reverse order a later test patched the package's `server`
    while `captioner demo` imported sys.modules' one, and served for real until killed."""
    require_module("gradio", "the demo extra is not installed")
    import captioner.apps.demo.server as before

    with pytest.MonkeyPatch.context() as monkeypatch:
        forget_module(monkeypatch, "captioner.apps.demo.server")
        import captioner.apps.demo.server as fresh
        assert fresh is not before
    import captioner.apps.demo as package

    assert sys.modules["captioner.apps.demo.server"] is before and package.server is before


def test_every_command_has_rows() -> None:
    """A command added to the parser needs its rows in the table: at least one refusal."""
    walked = {tuple(row.argv[: len(path)]) for row in ROWS.values() if row.code == 2
              for path in command_paths(build_parser())}
    missing = [" ".join(path) for path in command_paths(build_parser()) if path not in walked]
    assert missing == []


def test_training_into_an_earlier_run_without_resume_keeps_every_file_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A new run into a folder that holds a finished one would write its best.pt, last.pt and metrics.csv over
    the earlier run's: refused in one line before the shapes world is generated or a model built."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "x"
    files = earlier_run(run)
    monkeypatch.setattr(WORK["train"], refuse("train started its work before refusing"))
    code, lines = run_cli(["train", SHAPES, "train.out_dir=runs/x", "train.epochs=1"], capsys, caplog)
    assert (code, lines) == (2, ["error: train.out_dir=runs/x already holds a run (best.pt, last.pt): continue it "
                                 "with --resume, or give another train.out_dir (or delete it)"])
    assert {path.name: path.read_bytes() for path in run.iterdir()} == files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # no shapes world generated under data/


def test_a_folder_without_a_checkpoint_is_trained_into_and_a_run_is_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Notes, an empty tensorboard folder and the metrics of a run that failed before its first checkpoint
    are no run: training goes into the folder as before. With --resume an earlier run is continued."""
    monkeypatch.chdir(tmp_path)
    trained: list[tuple[str, bool]] = []

    def train_run(config, resume: bool = False) -> Path:
        trained.append((config.train.out_dir, resume))
        return Path(config.train.out_dir) / "best.pt"

    monkeypatch.setattr(WORK["train"], train_run)
    mine = tmp_path / "mine"
    (mine / "tensorboard").mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    (mine / "metrics.csv").write_text("epoch,step\n")
    earlier_run(tmp_path / "run")
    assert run_cli(["train", SHAPES, "train.out_dir=mine"], capsys, caplog) == (0, [])
    assert run_cli(["train", SHAPES, "train.out_dir=run", "--resume"], capsys, caplog) == (0, [])
    assert trained == [("mine", False), ("run", True)] and (mine / "notes.txt").read_text() == "mine"


def test_under_torchrun_rank_0_alone_decides_on_an_earlier_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Rank 0 alone writes the run folder, so its view of it decides and it alone says the refusal (torchrun then
    stops the others); another rank goes on to wait for rank 0 in the process group."""
    monkeypatch.chdir(tmp_path)
    earlier_run(tmp_path / "run")
    trained: list[str] = []
    monkeypatch.setattr(WORK["train"], lambda config, resume=False: trained.append(config.train.out_dir) or "best.pt")

    def leave(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr("captioner.training.distributed.abort", leave)  # not os._exit, in the test's process
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert run_cli(["train", SHAPES, "train.out_dir=run"], capsys, caplog) == (0, [])
    assert trained == ["run"]
    monkeypatch.setenv("RANK", "0")
    code, lines = run_cli(["train", SHAPES, "train.out_dir=run"], capsys, caplog)
    assert code == 2 and lines == ["error: rank 0: train.out_dir=run already holds a run (best.pt, last.pt): "
                                   "continue it with --resume, or give another train.out_dir (or delete it)"]
    assert trained == ["run"]


def test_under_torchrun_a_refusal_every_rank_raises_alike_is_said_once_by_rank_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A --resume refused on every rank (rank 0's decision, `Distributed.agree`): rank 0 prints its one line, the
    other ranks none, and each waits for the others before it leaves, so torchrun stops none before rank 0 has
    said it. A rank's own refusal is still its own to say."""
    import torch

    from captioner.core.errors import CheckpointError
    from captioner.training.distributed import Distributed

    monkeypatch.chdir(tmp_path)
    earlier_run(tmp_path / "run")
    waited: list[int] = []

    class Rank(Distributed):
        def broadcast(self, obj: object) -> object:
            return CheckpointError("--resume: run/last.pt was validated on other val images") if obj is None else obj

        def barrier(self) -> None:
            waited.append(self.rank)

    def refused_alike(config: object, resume: bool = False) -> None:
        Rank(torch.device("cpu"), rank, 2).agree(None)

    def leave(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(WORK["train"], refused_alike)
    monkeypatch.setattr("captioner.training.distributed.abort", leave)
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        code, said = run_cli(["train", SHAPES, "train.out_dir=run", "--resume"], capsys, caplog)
        assert code == 2 and said == ([] if rank else
                                      ["error: rank 0: --resume: run/last.pt was validated on other val images"])
    assert waited == [1, 0]


def test_under_torchrun_a_runs_info_and_warnings_come_from_rank_0_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """Another rank's copies of the run's info and warnings (a threads warning, the data's counts) are dropped;
    its errors, its own share's counts (EVERY_RANK) and at -v its debug lines stay."""
    from captioner.apps.cli import setup_logging
    from captioner.core.progress import EVERY_RANK

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # a fresh command's logging, not pytest's
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setenv("WORLD_SIZE", "2")
    log = logging.getLogger("captioner.training.speed")
    for rank, verbosity in (("1", 0), ("1", 1), ("0", 0)):
        monkeypatch.setenv("RANK", rank)
        root.handlers.clear()
        setup_logging(verbosity)
        log.debug("speed choices")
        log.info("shapes: 16 train images")
        log.warning("threads: 4 (train.threads), more than the 2 cores")
        log.warning("3 broken samples skipped in epoch 1 so far (rank %s)", rank, extra=EVERY_RANK)
        log.error("a failure")
        said = [line.rsplit(" ", 1)[-1] if verbosity else line for line in capsys.readouterr().err.splitlines()]
        assert said == {("1", 0): ["3 broken samples skipped in epoch 1 so far (rank 1)", "a failure"],
                        ("1", 1): ["choices", "1)", "failure"],
                        ("0", 0): ["shapes: 16 train images", "threads: 4 (train.threads), more than the 2 cores",
                                   "3 broken samples skipped in epoch 1 so far (rank 0)", "a failure"]}[rank, verbosity]


def test_caption_of_a_missing_photo_is_one_line_in_a_real_process(tmp_path: Path) -> None:
    """`captioner caption missing.jpg` as typed in a shell: with the default model's log lines and
    all, stderr is one line and the status 2, and no model is loaded for it."""
    done = warm_start.run([sys.executable, "-m", "captioner", "caption", "missing.jpg"], cwd=tmp_path,
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stderr, done.stdout) == (2, "error: missing.jpg: no such file\n", "")


def test_caption_of_an_unreadable_photo_is_one_line_and_a_partial_failure_names_the_model(tmp_path: Path) -> None:
    """The default model loads for a photo that exists but is not an image: the lines saying which
    model captions are held back, so the refusal is stderr's one line; beside a good photo they are
    said, the bad one named and the count last."""
    (tmp_path / "bad.jpg").write_bytes(b"not an image")
    Image.new("RGB", (64, 64), (200, 30, 30)).save(tmp_path / "good.png")
    command = [sys.executable, "-m", "captioner", "caption"]
    refused = warm_start.run([*command, "bad.jpg"], cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                             timeout=300)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.splitlines() == [
        "error: bad.jpg: not an image file; supported formats: JPEG, PNG, WEBP, GIF, BMP, TIFF"]
    partial = warm_start.run([*command, "good.png", "bad.jpg"], cwd=tmp_path, env=subprocess_env(), capture_output=True,
                             text=True, timeout=300)
    lines = partial.stderr.splitlines()
    assert partial.returncode == 1 and partial.stdout.startswith("good.png\t")
    assert any(line.startswith("captioning with ") for line in lines) and lines[-2:] == [refused.stderr.strip(),
                                                                                         "1 of 2 images failed"]


def test_first_line_is_the_messages_first_line_or_the_types_name() -> None:
    from captioner.core.errors import first_line

    assert first_line(ValueError("  bad header\nat byte 7")) == "bad header"
    assert first_line(OSError()) == "OSError" and first_line(ValueError(" \n")) == "ValueError"
    assert first_line(RuntimeError("x" * 300), 160) == "x" * 160


def test_a_zip_that_is_no_torch_archive_is_one_line_without_torchs_plea(tmp_path: Path) -> None:
    """torch's C++ checks end their messages with a request to torch's developers; the user's line leaves it out."""
    import zipfile

    from captioner.core.errors import CheckpointError
    from captioner.models.checkpoint_format import read_checkpoint

    garbage = tmp_path / "garbage.pt"
    with zipfile.ZipFile(garbage, "w") as archive:
        archive.writestr("a/data.pkl", "garbage")  # torch's layout, without its version record
    with pytest.raises(CheckpointError) as refused:
        read_checkpoint(garbage)
    line = str(refused.value)
    assert line.startswith(f"{garbage}: not a readable captioner checkpoint (") and line.endswith(")"), line
    assert "Could this error message be improved" not in line and "\n" not in line


def test_an_unreadable_parquet_file_is_our_one_line_not_the_readers_lines_too(tmp_path: Path) -> None:
    """The datasets library logs each Parquet file it cannot read, on its own handler, before our one line says it
    again: three lines for one mistake, in data stats and data shards alike."""
    require_module("datasets", "the train extra is not installed")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "data.parquet").write_text("not a parquet file")
    for argv in (["data", "stats", "--hf", "hf"], ["data", "shards", "--hf", "hf", "--out", "shards"]):
        done = warm_start.run([sys.executable, "-m", "captioner", *argv], cwd=tmp_path, env=subprocess_env(),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and done.stderr.splitlines() == [done.stderr.strip()], done.stderr
        assert done.stderr.startswith("error: hf: cannot read the Hugging Face dataset (ArrowInvalid: "), done.stderr
