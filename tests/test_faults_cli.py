"""Fault: a command line typed in another order. Options may come before, between and after
the positionals (CONFIG and its overrides, CHECKPOINT and its images), for every command."""

from __future__ import annotations

import pytest

from captioner.apps.cli import build_parser

# (argv in three orders, what every order must parse to)
CASES = {
    "train": (
        [["train", "c.yaml", "--init", "x.pt", "train.epochs=3", "--resume", "data.batch_size=2"],
         ["train", "--resume", "c.yaml", "train.epochs=3", "--init", "x.pt", "data.batch_size=2"],
         ["train", "c.yaml", "train.epochs=3", "data.batch_size=2", "--init", "x.pt", "--resume"]],
        {"config": "c.yaml", "overrides": ["train.epochs=3", "data.batch_size=2"], "init": "x.pt", "resume": True},
    ),
    "features": (
        [["features", "c.yaml", "--splits", "val", "train.device=cpu", "--out", "d", "data.batch_size=2"],
         ["features", "--out", "d", "c.yaml", "train.device=cpu", "--splits", "val", "data.batch_size=2"],
         ["features", "c.yaml", "train.device=cpu", "data.batch_size=2", "--splits", "val", "--out", "d"]],
        {"config": "c.yaml", "overrides": ["train.device=cpu", "data.batch_size=2"], "splits": "val", "out": "d"},
    ),
    "data stats": (
        [["data", "stats", "c.yaml", "--min-count", "3", "data.min_word_count=2", "--json",
          "data.max_caption_length=9"],
         ["data", "stats", "--json", "c.yaml", "data.min_word_count=2", "--min-count", "3",
          "data.max_caption_length=9"],
         ["data", "stats", "c.yaml", "data.min_word_count=2", "data.max_caption_length=9", "--min-count",
          "3", "--json"]],
        {"config": "c.yaml", "overrides": ["data.min_word_count=2", "data.max_caption_length=9"], "min_count": 3,
         "json": True},
    ),
    "caption": (
        [["caption", "m.pt", "--beam", "3", "a.jpg", "--json", "b.jpg"],
         ["caption", "--json", "m.pt", "a.jpg", "--beam", "3", "b.jpg"],
         ["caption", "m.pt", "a.jpg", "b.jpg", "--beam", "3", "--json"]],
        {"checkpoint": "m.pt", "images": ["a.jpg", "b.jpg"], "beam": 3, "json": True},
    ),
    "evaluate": (
        [["evaluate", "m.pt", "--split", "val", "--limit", "3"],
         ["evaluate", "--split", "val", "m.pt", "--limit", "3"],
         ["evaluate", "--split", "val", "--limit", "3", "m.pt"]],
        {"checkpoint": "m.pt", "split": "val", "limit": 3},
    ),
    "export": (
        [["export", "m.pt", "--onnx", "out"], ["export", "--onnx", "m.pt", "out"], ["export", "m.pt", "out", "--onnx"]],
        {"checkpoint": "m.pt", "folder": "out", "onnx": True},
    ),
    "push": (
        [["push", "m.pt", "--private", "o/n"], ["push", "--private", "m.pt", "o/n"],
         ["push", "m.pt", "o/n", "--private"]],
        {"checkpoint": "m.pt", "repo_id": "o/n", "private": True},
    ),
    "data shapes": (
        [["data", "shapes", "--out", "d", "--num-train", "4"], ["data", "shapes", "--num-train", "4", "--out", "d"],
         ["data", "shapes", "--num-train=4", "--out=d"]],
        {"out": "d", "num_train": 4},
    ),
}


@pytest.mark.parametrize("command", sorted(CASES))
@pytest.mark.parametrize("order", [0, 1, 2], ids=["between", "before", "after"])
def test_options_and_positionals_in_any_order(command: str, order: int) -> None:
    orders, expected = CASES[command]
    args = build_parser().parse_args(orders[order])
    assert {key: getattr(args, key) for key in expected} == expected


def test_the_issue_command_line_parses() -> None:
    args = build_parser().parse_args(
        ["train", "configs/coco_lstm_resnet101_scst.yaml", "--init", "runs/x/best.pt", "train.epochs=3"])
    assert (args.config, args.init, args.overrides) == ("configs/coco_lstm_resnet101_scst.yaml", "runs/x/best.pt",
                                                        ["train.epochs=3"])


def test_an_unknown_option_is_still_refused_wherever_it_stands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["train", "c.yaml", "--no-such-flag", "train.epochs=3"])
    assert info.value.code == 2 and "--no-such-flag" in capsys.readouterr().err


def test_ensemble_members_end_at_the_next_option() -> None:
    args = build_parser().parse_args(["caption", "m.pt", "a.jpg", "--ensemble", "x.pt", "y.pt", "--beam", "2", "b.jpg"])
    assert (args.images, args.ensemble, args.beam) == (["a.jpg", "b.jpg"], ["x.pt", "y.pt"], 2)
