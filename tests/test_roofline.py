"""The roofline benchmark's counter: it sees every route a product takes (oneDNN's inner product as
well as torch's), agrees with the LSTM step's hand count, moves no bytes for views, and the
benchmark prints its table end to end."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch

from benchmarks import bench_roofline, records, workloads
from benchmarks.op_counter import OpCount, OpCounter, lstm_step_flops
from captioner.core.config import load_config
from captioner.models import products
from helpers import REPO, render_results


@pytest.fixture
def route():
    """Set the oneDNN route for one test, and put the process's choice back after it."""
    before = products._ENABLED, products._CHECKED, products._GRAM_MM, products._GRAD_MM
    yield products.set_onednn
    products._ENABLED, products._CHECKED, products._GRAM_MM, products._GRAD_MM = before


@pytest.mark.parametrize("onednn", [False, True])
def test_the_lstm_steps_count_equals_the_hand_count_on_either_route(route, onednn: bool) -> None:
    if onednn and not products.onednn_enabled():
        pytest.skip("this torch build has no oneDNN inner product")
    route(onednn)
    config = workloads.coco_config("lstm")
    decoder = replace(config.model.decoder, embed_dim=48, hidden_dim=40, attention_dim=24)
    config = replace(config, model=replace(config.model, decoder=decoder))
    model = workloads.build(config, workloads.words(300))
    images, feats = 3, torch.randn(3, 196, workloads.FEAT_DIM).half()  # (B, N, D) as stored
    batch = workloads.caption_rows(feats, 2, 8, model.vocab, torch.Generator().manual_seed(0))
    counter = bench_roofline.counted(workloads.train_step(model, config, batch, encoded=True))
    names = {op.name for op in counter.ops if op.flops}
    assert ("mkldnn._linear_pointwise.default" in names) == onednn  # the route taken is the route counted
    assert counter.flops == lstm_step_flops(images, 2 * images, 7, 196, workloads.FEAT_DIM, 24, 40, 48, 300)


def test_the_quickstart_step_has_the_shapes_worlds_caption_lengths() -> None:
    """A batch's longest caption sets how many steps the LSTM runs: the workload's captions are as long as
    the world writes them (3 to 36 words), so its batch holds a long one, as every real batch does."""
    data = replace(load_config(workloads.CONFIGS / "shapes_lstm.yaml").data, batch_size=16)
    tokens = workloads.world_caption_tokens(workloads.words(39), data)
    assert len(tokens) == 80 and min(tokens) >= 5 and max(tokens) <= 38  # <bos>, 3 to 36 words, <eos>
    assert max(tokens) >= 30 and tokens == workloads.world_caption_tokens(workloads.words(39), data)  # seeded
    assert f"their 5 captions of {min(tokens) - 2}-{max(tokens) - 2} words" in workloads.quickstart_step().about


def test_bytes_are_what_an_op_reads_and_writes_and_views_move_none() -> None:
    x = torch.ones(1000)
    with OpCounter() as counter:
        y = x + 1  # reads 4,000 bytes, writes 4,000
        y.view(10, 100)  # a view
        y.add_(x)  # reads y and x, writes y
    assert [op.bytes for op in counter.ops] == [8000, 0, 12000]
    assert counter.flops == 0  # elementwise work is not counted as FLOPs


def test_matrix_vector_and_onednn_products_are_counted(route) -> None:
    with OpCounter() as counter:
        torch.randn(5, 16) @ torch.randn(16)  # (5,): 2 * 5 * 16
    assert counter.flops == 160
    with OpCounter() as counter:
        torch.addmv(torch.randn(5), torch.randn(5, 16), torch.randn(16))  # (5,): the same product and a bias
    assert counter.flops == 160
    if not products.onednn_enabled():
        pytest.skip("this torch build has no oneDNN inner product")
    route(True)
    x, weight = torch.randn(5, 16), torch.randn(7, 16)
    with torch.no_grad(), OpCounter() as counter:
        products.linear(x, weight)
    assert counter.flops == 2 * 5 * 16 * 7
    assert "mkldnn._linear_pointwise.default" in [op.name for op in counter.ops]


def test_the_roofline_time_takes_each_ops_longer_bound() -> None:
    counter = OpCounter([OpCount("compute", 100, 1), OpCount("memory", 1, 100), OpCount("view", 0, 0)])
    assert bench_roofline.roofline_seconds(counter, peak=10.0, bandwidth=20.0) == pytest.approx(10.0 + 5.0)


def test_the_benchmark_prints_a_row_with_its_ratio_and_profile(tmp_path, capsys, monkeypatch) -> None:
    for measure in ("bench_roofline", "bench_profile"):
        shutil.copy(REPO / "docs" / "results" / f"{measure}.json", tmp_path)
    before = json.loads((tmp_path / "bench_roofline.json").read_text(encoding="utf-8"))["records"]
    profiles_before = json.loads((tmp_path / "bench_profile.json").read_text(encoding="utf-8"))["records"]
    monkeypatch.setattr(records, "commit", lambda: "abc1234")  # the suite may run outside a git checkout
    argv = ["--only", "quickstart_step", "--repeats", "1", "--peak-size", "1024", "--threads", "1",
            "--profile", str(tmp_path), "--record", "a_test", "--beside", "nothing", "--json"]
    assert bench_roofline.main(argv, results=tmp_path) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| quickstart train step"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert float(cells[1]) > 10  # GFLOP: the small CNN's convolutions, forward and backward
    seconds, bound = (float(cells[i].removesuffix(" ms").replace(",", "")) for i in (4, 7))
    assert float(cells[-1].removesuffix("x")) == pytest.approx(seconds / bound, abs=0.02)
    numbers = json.loads(out.splitlines()[-1])  # --json: the same numbers on the last line, for `goals`
    work = numbers["work"]["quickstart_step"]
    assert list(numbers["work"]) == ["quickstart_step"] and numbers["threads"] == 1
    assert work["gflop"] == pytest.approx(float(cells[1]), abs=0.01)
    assert work["seconds"] * 1e3 == pytest.approx(seconds, abs=1) and work["ratio"] == pytest.approx(seconds / bound,
                                                                                                    abs=0.02)
    assert "convolution" in (tmp_path / "quickstart_step.txt").read_text()
    assert (tmp_path / "quickstart_step.trace.json").stat().st_size > 0
    # --record: the row, as printed, under the measure's columns, with this run's command
    written = json.loads((tmp_path / "bench_roofline.json").read_text(encoding="utf-8"))["records"]
    peak, record = written[-2:]
    assert written[:-2] == before and [peak["id"], record["id"]] == ["a_test_peak", "a_test_quickstart_step"]
    assert peak["numbers"]["gb"].endswith(" GB/s (copy)") and " (fp32 GEMM, " in peak["numbers"]["rate"]
    assert list(record["numbers"].values()) == cells[1:]
    recorded = " ".join(argv).replace(str(tmp_path), "DIR")  # the maker's folder is not the record's
    assert record["command"].endswith("python -m benchmarks roofline " + recorded)
    assert record["label"].startswith("quickstart train step") and record["commit"] == "abc1234"
    assert record["note"].startswith("peak fp32 GEMM ") and record["concurrent"] == "nothing"
    # with --profile: the heaviest operators as a bench_profile record, its table copied beside the records
    profiles = json.loads((tmp_path / "bench_profile.json").read_text(encoding="utf-8"))["records"]
    summary = profiles[-1]
    assert profiles[:-1] == profiles_before and summary["id"] == "a_test_quickstart_step"
    assert (tmp_path / "profiles" / "a_test_quickstart_step.txt").read_text() == (
        tmp_path / "quickstart_step.txt").read_text()
    assert summary["numbers"]["table"] == "[operator table](results/profiles/a_test_quickstart_step.txt)"
    top = dict(part.rsplit(" ", 1) for part in summary["numbers"]["top"].split(", "))  # name -> 'N%'
    assert "convolution backward" in top and summary["command"] == record["command"]  # which is heaviest varies
    assert f"self CPU time by operator: {summary['numbers']['top']}" in out
    # its shares are the table's: the table's top row is in it, at its Self CPU % or more (forms summed)
    lines = (tmp_path / "quickstart_step.txt").read_text().splitlines()
    first = lines[lines.index(next(line for line in lines if line.strip().startswith("Name"))) + 2].split()
    name, percent = " ".join(first[:-6]), float(first[-6].removesuffix("%"))
    words = bench_roofline.OPERATOR_WORDS.get(name, name.removeprefix("aten::"))
    assert int(top[words].removesuffix("%")) >= round(percent) - 1
    columns = {c["key"] for c in json.loads((tmp_path / "bench_profile.json").read_text())["columns"]}
    assert render_results().record_problems(summary["id"], summary, columns) == []


def test_operators_are_named_as_a_reader_names_them_and_their_forms_summed() -> None:
    shares = bench_roofline.operator_shares({"aten::add": 2.0, "aten::add_": 3.0, "mkldnn::_linear_pointwise": 10.0,
                                             "aten::gather": 4.0, "aten::view": 0.1, "aten::bmm": 0.9})
    assert list(shares) == ["oneDNN's products", "add", "gather", "bmm", "view"]
    assert shares["add"] == pytest.approx(0.25) and sum(shares.values()) == pytest.approx(1.0)
    assert bench_roofline.top_operators(shares) == "oneDNN's products 50%, add 25%, gather 20%, bmm 4%"
    assert bench_roofline.top_operators(shares, most=2) == "oneDNN's products 50%, add 25%"
    assert bench_roofline.operator_shares({}) == {}


def test_a_profile_folder_that_is_a_file_is_one_line_before_any_work(tmp_path, capsys) -> None:
    taken = tmp_path / "profiles"
    taken.write_text("not a folder")
    with pytest.raises(SystemExit) as exit_:
        bench_roofline.main(["--only", "quickstart_step", "--profile", str(taken)])
    assert exit_.value.code == 2
    assert f"--profile {taken}: is a file, not a folder" in capsys.readouterr().err


def test_a_prefix_whose_records_exist_stops_before_any_work(tmp_path, monkeypatch) -> None:
    """An earlier run's records are not replaced by mistake: each id the run would write (the peak, each row,
    with --profile each profile) is looked up first, in both files; --replace lets them be replaced."""
    for measure in ("bench_roofline", "bench_profile"):
        shutil.copy(REPO / "docs" / "results" / f"{measure}.json", tmp_path)
    monkeypatch.setattr(bench_roofline, "gemm_peak", lambda size: pytest.fail("the run began"))
    argv = ["--only", "quickstart_step", "lstm_beam", "--record", "zen5_avx2"]
    with pytest.raises(SystemExit, match=r"bench_roofline.json: already has records zen5_avx2_lstm_beam, "
                                         r"zen5_avx2_peak, zen5_avx2_quickstart_step: give --record another name"):
        bench_roofline.main(argv, results=tmp_path)
    # a prefix only the profiles have: found with --profile, not without it
    records.save_records("bench_profile", [{"id": "mine_lstm_beam", "label": "x", "numbers": {}}], tmp_path)
    mine = ["--only", "lstm_beam", "--record", "mine"]
    with pytest.raises(SystemExit, match=r"bench_profile.json: already has record mine_lstm_beam: "):
        bench_roofline.main([*mine, "--profile", str(tmp_path)], results=tmp_path)
    for run in (mine, [*argv, "--profile", str(tmp_path), "--replace"]):
        with pytest.raises(pytest.fail.Exception, match="the run began"):
            bench_roofline.main(run, results=tmp_path)
