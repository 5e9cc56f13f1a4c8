"""WebDataset shards streamed to training (captioner/data/streaming.py): the epoch's plan, every
sample once over ranks and loader workers, resume mid-epoch, broken samples, one-line errors,
and two torchrun ranks with two workers each reading Flickr8k shards from a loopback HTTP server,
stopped mid-epoch and resumed."""

from __future__ import annotations

import functools
import io
import json
import math
import os
import random
import shlex
import signal
from collections import Counter
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

import pytest
import torch
from helpers import REPO, TINY_MODEL, fifo_with_a_writer, require, require_module, serving

SHAPES_LSTM = str(REPO / "configs/shapes_lstm.yaml")  # wherever pytest started
import warm_start
from PIL import Image
from test_distributed import environment as torchrun_environment
from test_faults_signals import ROOT, TORCHRUN, Training, resume_line
from test_flickr8k import flickr8k_224  # noqa: F401 - the fixture is used by name

from captioner.core.config import load_config
from captioner.core.errors import ConfigError, DatasetError
from captioner.data.datasets import load_split
from captioner.data.flickr8k import load_flickr8k
from captioner.data.image_transform import ImageTransform
from captioner.data.shards import open_shard_set, read_samples, write_shards, write_tar
from captioner.data.streaming import EpochPlan, ShardStream, StreamingCaptions, StreamSettings, plan_epoch
from captioner.text.vocab import Vocabulary

pytestmark = pytest.mark.usefixtures("webdataset_installed")


@pytest.fixture(scope="module")
def webdataset_installed() -> None:
    require_module("webdataset", "webdataset is not installed (pip install 'captioner[data]')")


def picture(seed: int) -> bytes:
    image = Image.new("RGB", (24, 24), tuple(random.Random(seed).randrange(256) for _ in range(3)))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG")
    return buffer.getvalue()


def make_shards(folder: Path, counts: list[int], broken: dict[str, str] | None = None, index: bool = True) -> list[str]:
    """Shards of tiny JPEGs with captions in img2dataset's layout; `broken` maps keys to what is
    wrong with them ("image": not a JPEG, "caption": none). Returns the keys of the good samples."""
    folder.mkdir(parents=True, exist_ok=True)
    broken = broken or {}
    good, listed = [], []
    for s, count in enumerate(counts):
        samples = []
        for k in range(count):
            key = f"{s:03d}{k:04d}"
            sample = {"__key__": key, "jpg": picture(s * 1000 + k), "txt": f"a picture number {k % 7}".encode(),
                      "json": json.dumps(
                          {"captions": [f"a picture number {k % 7}", f"a square of colour {s}"]}).encode()}
            if broken.get(key) == "image":
                sample["jpg"] = b"not a jpeg at all"
            elif broken.get(key) == "truncated":
                sample["jpg"] = sample["jpg"][: len(sample["jpg"]) // 2]
            elif broken.get(key) == "caption":
                del sample["txt"], sample["json"]
            else:
                good.append(key)
            samples.append(sample)
        write_tar(folder / f"{s:05d}.tar", samples)
        listed.append({"url": f"{s:05d}.tar", "nsamples": count})
    if index:
        (folder / "shards.json").write_text(json.dumps({"wids_version": 1, "shardlist": listed}))
    return good


def stream(folder: Path, count: int, rank: int = 0, world: int = 1, workers: int = 2, batch: int = 4,
           max_broken: float = 0.0, trace: Path | None = None) -> ShardStream:
    shards = open_shard_set(str(folder / f"{{00000..{count - 1:05d}}}.tar"), "test shards")
    vocab = Vocabulary.build(["a picture number 1", "a square of colour 2"], 1)
    settings = StreamSettings(seed=3, rank=rank, world=world, workers=workers, batch_size=batch, max_broken=max_broken,
                              buffer=8, max_length=10, pairs="one")
    return ShardStream(StreamingCaptions(shards, vocab, ImageTransform(16, train=True), settings), trace=trace)


def keys_of(trace: Path) -> list[str]:
    return [line.split()[1] for line in trace.read_text().splitlines()]


def full_batches(counts: tuple[int, ...], plan: EpochPlan, batch: int) -> list[list[int]]:
    """[rank][worker] -> the full batches of a worker's samples less its reserve, floor((n - reserve) / batch):
    what it yields before its rank gives any up to match the others (the module's docstring)."""
    return [[max(0, sum(counts[i] for i in mine) - kept) // batch for mine, kept in zip(rank, reserve)]
            for rank, reserve in zip(plan.shards, plan.reserve)]


def test_the_plan_reads_every_shard_once_and_gives_every_rank_the_same_steps() -> None:
    rng = random.Random(0)
    for _ in range(200):
        counts = tuple(rng.randrange(0, 40) for _ in range(rng.randrange(1, 30)))
        world, workers, batch = rng.randrange(1, 5), rng.randrange(1, 4), rng.randrange(1, 9)
        max_broken = rng.choice([0.0, 0.01, 0.2])
        plan = plan_epoch(counts, 7, 2, world, workers, batch, max_broken)
        assigned = sorted(i for rank in plan.shards for mine in rank for i in mine)
        assert assigned == list(range(len(counts)))  # every shard once, to one (rank, worker)
        full = full_batches(counts, plan, batch)
        # the fewest any rank has
        assert plan.steps == min(sum(rank) for rank in full), (counts, world, workers, batch, max_broken)
        assert {sum(rank) for rank in plan.batches} == {plan.steps}  # DDP: the same number of steps on every rank
        for r in range(world):
            for w in range(workers):
                n = sum(counts[i] for i in plan.shards[r][w])
                assert plan.reserve[r][w] == math.ceil(max_broken * n)
                assert 0 <= plan.batches[r][w] <= full[r][w]  # enough samples even with the reserve broken
                if plan.batches[r][w] < full[r][w]:  # a worker that gave up batches was among its rank's largest
                    assert plan.batches[r][w] >= max(plan.batches[r]) - 1
        # a pure function: a resume replays it
        assert plan == plan_epoch(counts, 7, 2, world, workers, batch, max_broken)
    epochs = {plan_epoch(tuple(range(10, 30)), 7, e, 2, 2, 4, 0.0).shards for e in range(1, 6)}
    assert len(epochs) == 5  # the shards move between ranks and workers from epoch to epoch


def test_two_ranks_with_two_workers_train_every_full_batch_and_no_sample_twice(tmp_path: Path) -> None:
    """Every worker trains all its full batches of 4, and each sample of the shards once, but the
    last partial batch of each worker: these shards give both ranks 9 full batches (workers of 23
    and 16 samples, and of 22 and 19), so neither gives any up to match the other."""
    counts = [9, 11, 10, 12, 8, 10, 13, 7]
    everything = make_shards(tmp_path / "shards", counts)
    plan = plan_epoch(tuple(counts), 3, 1, 2, 2, 4, 0.0)
    sizes = sorted(sorted(sum(counts[i] for i in mine) for mine in rank) for rank in plan.shards)
    assert sizes == [[16, 23], [19, 22]]  # the seed's plan that the docstring describes
    seen: list[str] = []
    for rank in range(2):
        trace = tmp_path / f"rank{rank}.txt"
        loader = stream(tmp_path / "shards", len(counts), rank=rank, world=2, trace=trace)
        loader.set_epoch(1)
        batches = list(loader)
        assert len(batches) == len(loader) == 9 and all(len(b.indices) == 4 for b in batches)
        keys = keys_of(trace)
        for w, mine in enumerate(plan.shards[rank]):
            n = sum(counts[i] for i in mine)
            trained = [k for k in keys if int(k[:3]) in mine]  # a key is its shard's number and its place there
            assert len(trained) == 4 * (n // 4), (rank, w)  # all of the worker's full batches, from its own shards
        assert len(keys) == 9 * 4
        seen += keys
    assert len(seen) == len(set(seen))  # none twice
    assert set(seen) <= set(everything)
    left_out = Counter(int(k[:3]) for k in set(everything) - set(seen))
    for rank in plan.shards:  # what a worker leaves out is its last partial batch, and nothing else
        for mine in rank:
            assert sum(left_out[i] for i in mine) == sum(counts[i] for i in mine) % 4


def test_a_stream_resumed_mid_epoch_trains_the_same_batches_none_twice(tmp_path: Path) -> None:
    make_shards(tmp_path / "shards", [10, 10, 10, 10, 10, 10])
    whole = stream(tmp_path / "shards", 6)
    whole.set_epoch(2)
    # indices: each sample's draw number in its worker
    expected = sorted(tuple(sorted(b.indices.tolist())) for b in whole)

    first = stream(tmp_path / "shards", 6, trace=tmp_path / "first.txt")
    first.set_epoch(2)
    taken = []
    for batch in first:
        taken.append(tuple(sorted(batch.indices.tolist())))
        if len(taken) == 5:
            break
    saved = first.positions()
    assert sum(p[0] for p in saved) == 5

    second = stream(tmp_path / "shards", 6, trace=tmp_path / "second.txt")
    second.resume(saved, "last.pt")
    second.set_epoch(2, start=5)
    rest = [tuple(sorted(b.indices.tolist())) for b in second]
    assert len(taken) + len(rest) == len(whole)
    keys = keys_of(tmp_path / "first.txt") + keys_of(tmp_path / "second.txt")
    assert len(keys) == len(set(keys))  # nothing repeated
    whole_keys = tmp_path / "whole.txt"
    again = stream(tmp_path / "shards", 6, trace=whole_keys)
    again.set_epoch(2)
    list(again)
    assert sorted(keys) == sorted(keys_of(whole_keys))  # nothing skipped: the same samples as the uninterrupted epoch
    assert sorted(taken + rest) == expected  # and the same batches
    with pytest.raises(DatasetError, match="saved with 2 loader worker"):
        stream(tmp_path / "shards", 6, workers=3).resume(saved, "last.pt")


def test_broken_samples_are_skipped_and_counted_and_too_many_stop_the_run_in_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = make_shards(tmp_path / "shards", [20, 20],
                       broken={"0000003": "image", "0000011": "truncated", "0010005": "caption"})
    loader = stream(tmp_path / "shards", 2, workers=0, max_broken=0.08, trace=tmp_path / "keys.txt")
    loader.set_epoch(1)
    batches = list(loader)
    assert len(batches) == len(loader) == 9  # 40 samples, 4 held in reserve for broken ones: 36 // 4
    assert set(keys_of(tmp_path / "keys.txt")) <= set(good)
    assert sum(p[2] for p in loader.positions()) == 3
    assert any("0000003" in r.message and "skipping a broken sample" in r.message for r in caplog.records)

    strict = stream(tmp_path / "shards", 2, workers=0, max_broken=0.0)
    strict.set_epoch(1)
    with pytest.raises(DatasetError) as raised:
        list(strict)
    message = str(raised.value)
    assert "\n" not in message and "max_broken_fraction" in message and ".tar#" in message


def test_counts_come_from_the_index_or_img2dataset_stats_and_errors_take_one_line(tmp_path: Path) -> None:
    make_shards(tmp_path / "wids", [3, 4])
    assert open_shard_set(str(tmp_path / "wids" / "{00000..00001}.tar"), "x").counts == (3, 4)
    piped = open_shard_set(f"pipe:cat {shlex.quote(str(tmp_path / 'wids' / '00001.tar'))}", "x")
    assert piped.counts == (4,)  # the index read by the same command
    assert [s["__key__"] for s in read_samples(piped.urls)] == [f"001{k:04d}" for k in range(4)]

    make_shards(tmp_path / "img2dataset", [5, 2], index=False)
    for s, n in enumerate([5, 2]):
        (tmp_path / "img2dataset" / f"{s:05d}_stats.json").write_text(
            json.dumps({"count": n, "successes": n, "failed_to_download": 0}))
    assert open_shard_set(str(tmp_path / "img2dataset" / "{00000..00001}.tar"), "x").counts == (5, 2)

    cases = {
        "": "names no shards",
        str(tmp_path / "wids" / "{00000..00002}.tar"): "00002.tar: the shard's sample count is unknown",
        str(tmp_path / "wids" / "notes.txt"): "is not a .tar shard",
        "http://127.0.0.1:9/{00000..00001}.tar": "does not answer",
    }
    for pattern, expected in cases.items():
        with pytest.raises(DatasetError) as raised:
            open_shard_set(pattern, "data.train_shards")
        assert expected in str(raised.value) and "\n" not in str(raised.value)
    (tmp_path / "wids" / "shards.json").write_text("{")
    with pytest.raises(DatasetError, match="shards.json: not a shard index"):
        open_shard_set(str(tmp_path / "wids" / "00000.tar"), "x")
    (tmp_path / "wids" / "shards.json").write_text("[" * 100_000)  # was a RecursionError's traceback
    with pytest.raises(DatasetError, match="shards.json: not a shard index"):
        open_shard_set(str(tmp_path / "wids" / "00000.tar"), "x")
    (tmp_path / "img2dataset" / "00001_stats.json").write_text("[" * 100_000)
    with pytest.raises(DatasetError, match="00001_stats.json: not an img2dataset stats file"):
        open_shard_set(str(tmp_path / "img2dataset" / "00001.tar"), "x")
    (tmp_path / "wids" / "shards.json").unlink()
    with fifo_with_a_writer(tmp_path / "wids" / "shards.json"), pytest.raises(  # its reader waited for a writer
            DatasetError, match=r"shards.json: the shard index is not a regular file \(a pipe"):
        open_shard_set(str(tmp_path / "wids" / "00000.tar"), "x")


def test_a_samples_json_nested_past_pythons_limit_is_a_broken_sample() -> None:
    """A shard's sample whose .json nests 100,000 lists deep was a RecursionError's traceback in the loader."""
    from captioner.data.shards import BrokenSample, sample_captions, sample_image_id

    deep = {"__key__": "0000001", "json": b"[" * 100_000, "txt": b"a dog"}
    with pytest.raises(BrokenSample, match="its .json is not valid JSON"):
        sample_captions(deep)
    assert sample_image_id(deep, 7) == 7


def test_val_and_test_shards_are_read_whole_as_records_of_any_dataset(tmp_path: Path) -> None:
    good = make_shards(tmp_path / "val", [5, 4], broken={"0000002": "image", "0010001": "caption"})
    config = load_config(None, ["data.dataset=webdataset", "data.train_shards=x.tar",
                                f"data.val_shards={tmp_path / 'val'}/{{00000..00001}}.tar"])
    records = load_split(config.data, "val")
    # no caption: left out; a bad image: skipped when loaded, named
    assert [r.path.name for r in records] == sorted([*good, "0000002"])
    assert records[0].captions == ("a picture number 0", "a square of colour 0") and records[0].image_id == 0
    assert Image.open(io.BytesIO(records[1].stored.read(records[1].row))).size == (24, 24)
    with pytest.raises(DatasetError, match="data.test_shards is not set"):
        load_split(config.data, "test")


def test_stats_and_model_cards_count_shards_without_keeping_their_images(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    from captioner.apps.cli import main
    from captioner.apps.model_card import _data_size

    make_shards(tmp_path / "train", [6, 5])
    make_shards(tmp_path / "val", [3])
    overrides = ["data.dataset=webdataset", f"data.train_shards={tmp_path / 'train'}/{{00000..00001}}.tar",
                 f"data.val_shards={tmp_path / 'val'}/00000.tar"]
    assert main(["data", "stats", SHAPES_LSTM, *overrides, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    # train and val; no test shards named
    assert stats["images"] == 14 and stats["captions"] == 28 and "images missing" not in stats
    config = load_config(None, overrides)
    assert all(r.stored is None for r in load_split(config.data, "train", check_images=False))
    assert _data_size(config) == "11 training samples in 2 shards"  # from shards.json, no shard opened


def test_the_config_asks_for_the_shards_and_refuses_scst_on_a_stream() -> None:
    with pytest.raises(ConfigError, match="'data.train_shards' is required"):
        load_config(None, ["data.dataset=webdataset"])
    with pytest.raises(ConfigError, match="scst needs every training image's references"):
        load_config(None,
                    ["data.dataset=webdataset", "data.train_shards=a.tar", "data.val_shards=b.tar", "train.stage=scst"])


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # no line per request on the test's stderr
        pass


@pytest.fixture
def http_server(tmp_path: Path):
    """A loopback HTTP server over tmp_path/served; yields its base URL."""
    served = tmp_path / "served"
    served.mkdir()
    with serving(functools.partial(Quiet, directory=str(served))) as base:
        yield base, served


@pytest.mark.slow
def test_two_torchrun_ranks_stream_flickr8k_shards_over_http_and_resume_after_a_stop(
    flickr8k_224: tuple[Path, Path], tmp_path: Path, http_server: tuple[str, Path],  # noqa: F811
) -> None:
    """Flickr8k photos written as shards (`write_shards`, 12 a shard), served on 127.0.0.1, trained
    by 2 ranks x 2 loader workers; SIGTERM to torchrun mid-epoch 1, then --resume: the samples of
    epoch 1 are the shard set's, each trained once, and the run finishes epoch 2."""
    require(Path("/proc/self/task").is_dir(), "finds torchrun's processes in /proc (Linux)")
    text, images = flickr8k_224
    base, served = http_server
    train = load_flickr8k(text, "train", images)[:96]
    val = load_flickr8k(text, "val", images)[:4]
    write_shards(train, served / "train", max_count=12, progress=False)
    write_shards(val, served / "val", max_count=12, progress=False)
    keys = {f"{r.image_id:09d}" for r in train}

    trace = tmp_path / "trace"
    trace.mkdir()
    env = torchrun_environment(tmp_path / "site", CAPTIONER_TRACE_SAMPLES=str(trace))
    overrides = [*TINY_MODEL, "model.encoder.name=small_cnn", "data.dataset=webdataset",
                 f"data.train_shards={base}/train/{{00000..00007}}.tar",
                 f"data.val_shards={base}/val/00000.tar", "data.num_workers=2", "data.batch_size=3",
                 "data.shuffle_buffer=5",
                 "data.max_broken_fraction=0", "train.epochs=2", "train.log_every=1", "train.warmup_steps=1",
                 "decode.max_length=8",
                 "train.checkpoint_every_steps=0", f"train.out_dir={tmp_path / 'run'}"]
    stopped = Training([*TORCHRUN, "-v", "train", SHAPES_LSTM, *overrides], env)
    stopped.wait_for_step(5)  # 96 samples / (2 ranks x 3) = 16 steps an epoch
    os.kill(stopped.process.pid, signal.SIGTERM)
    code, err = stopped.finish(timeout=300)
    step, resume = resume_line(err, signal.SIGTERM)
    assert code != 0 and 5 <= step < 16, err[-3000:]
    saved = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["train_state"]
    # 2 ranks x 2 workers' positions
    assert len(saved["stream"]) == 2 and all(len(ranks) == 2 for ranks in saved["stream"])
    assert sum(p[0] for p in saved["stream"][0]) == step

    words = shlex.split(resume)
    resumed = warm_start.run([*TORCHRUN, "-v", *words[4:]], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    trained = [line.split() for rank in (0, 1) for line in (trace / f"rank{rank}.txt").read_text().splitlines()]
    per_epoch = Counter(epoch for epoch, _ in trained)
    assert per_epoch == {"1": 96, "2": 96}  # 16 steps x 2 ranks x 3 images in each epoch, the stopped one included
    for epoch in ("1", "2"):
        seen = [key for e, key in trained if e == epoch]
        assert sorted(seen) == sorted(keys)  # every sample of the shard set, once: 96 samples divide into whole batches
    assert f'File "{ROOT / "captioner"}' not in resumed.stderr


def test_a_training_run_streams_its_shards_within_the_configs_limits(tmp_path: Path) -> None:
    """The train shards a run streams are read with the data section's limits, not the defaults."""
    from captioner.training.fit import train_shard_set

    make_shards(tmp_path / "train", [3, 2])
    overrides = ["data.dataset=webdataset", f"data.train_shards={tmp_path / 'train'}/{{00000..00001}}.tar",
                 "data.val_shards=v.tar"]
    shards = train_shard_set(load_config(None, [*overrides, "data.max_member_bytes=4096"]))
    assert shards.samples == 5 and shards.limits.member_bytes == 4096
    with pytest.raises(DatasetError, match="max_index_bytes"):
        train_shard_set(load_config(None, [*overrides, "data.max_index_bytes=16"]))
