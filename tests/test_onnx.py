"""The ONNX export and the torch-free runtime (captioner.deploy): the same captions, scores and
attention maps as PyTorch, decoding without torch, and one-line errors for bad folders and images.

The models are tiny and trained for a few seconds to memorise captions of random lengths for 16
random images, so their captions differ between images, end at different steps and give beam
search real choices (random weights caption every image alike).
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO, WORDS, edit_json, require_module, subprocess_env, tiny_model
from PIL import Image

from captioner.core.files import sha256_of
from captioner.core.errors import CaptionerError, ConfigError, ExportError, ImageLoadError
from captioner.core.model_spec import ONNX_FORMAT, ONNX_FORMAT_VERSION
from captioner.models.captioner import Captioner
from captioner.text.vocab import BAD_ENDINGS

require_module("onnxruntime", "the ONNX runtime tests need onnxruntime (pip install captioner[onnx])")

from captioner.deploy.runtime import OnnxCaptioner, image_array  # noqa: E402
from captioner.deploy.numpy_search import SearchOptions, TokenRules, beam_search, greedy_search  # noqa: E402
from captioner.models import onnx_export  # noqa: E402
from captioner.models.onnx_export import export_onnx  # noqa: E402

# One pytest worker for the module: each worker that ran some of its tests trained and exported both models again.
pytestmark = pytest.mark.xdist_group("onnx")


def briefly_trained(kind: str, steps: int = 120, seed: int = 0) -> Captioner:
    """A tiny model taught, by teacher forcing, a random caption of 2 to 7 words for each of 16
    random 32 px images."""
    torch.set_num_threads(1)
    model = tiny_model(f"model.decoder.type={kind}", "model.decoder.dropout=0.0", seed=seed)
    rng = np.random.default_rng(seed)
    images = torch.from_numpy(rng.integers(0, 256, (16, 3, 32, 32), dtype=np.uint8))  # (16, 3, 32, 32)
    encoded = [model.vocab.encode(" ".join(rng.choice(WORDS, size=rng.integers(2, 8)))) for _ in range(16)]
    T = max(map(len, encoded))
    tokens = torch.tensor([ids + [0] * (T - len(ids)) for ids in encoded])  # (16, T)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        logits = model(images, tokens[:, :-1]).logits  # (16, T-1, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), ignore_index=0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@dataclass
class Exported:
    model: Captioner
    folder: Path  # what export_onnx was given; the graphs are in folder/onnx
    runtime: OnnxCaptioner


@pytest.fixture(scope="module", params=["lstm", "transformer"])
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Exported:
    model = briefly_trained(request.param, seed=1)
    folder = tmp_path_factory.mktemp(f"export_{request.param}")
    export_onnx(model, folder)
    return Exported(model, folder, OnnxCaptioner.from_folder(folder, threads=1))


@pytest.fixture(scope="module")
def pictures() -> list:
    """Images of several sizes and modes, as PIL pictures and as encoded bytes."""
    rng = np.random.default_rng(1)
    items: list = []
    for i, (h, w) in enumerate([(32, 32), (40, 57), (90, 31), (64, 64), (33, 48), (50, 50), (28, 70), (45, 45)]):
        picture = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        if i % 2:
            buffer = io.BytesIO()
            picture.save(buffer, format="PNG")
            items.append(buffer.getvalue())
        else:
            items.append(picture)
    items.append(Image.fromarray(rng.integers(0, 256, (36, 36), dtype=np.uint8), mode="L"))
    items.append(Image.fromarray(rng.integers(0, 256, (36, 44, 4), dtype=np.uint8), mode="RGBA"))
    return items


DECODINGS = [
    {"beam_size": 1},
    {"beam_size": 3},
    {"beam_size": 3, "length_penalty": 0.7, "block_trigrams": True},
    {"beam_size": 4, "max_length": 4},  # many beams cut off: finished and live ones compete at max_length
    {"beam_size": 1, "max_length": 3, "block_trigrams": True},
    {"beam_size": 2, "batch_size": 4},  # several batches, the last one short
    # the ending rule, as models/decoding/rules.py applies it
    {"beam_size": 1, "min_length": 6, "suppress_bad_endings": True},
    {"beam_size": 3, "min_length": 8, "suppress_bad_endings": True},
]


@pytest.mark.parametrize("options", DECODINGS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_captions_scores_and_maps_equal_pytorch(exported: Exported, pictures: list, options: dict) -> None:
    expected = exported.model.caption(pictures, **options)
    got = exported.runtime.caption(pictures, **options)
    assert len({c.text for c in expected}) >= 3  # the images get different captions
    if options.get("max_length", 30) <= 4:
        assert any(not c.finished for c in expected)  # the cut-off path is exercised
    if "min_length" in options:  # the rule changes captions here, so the runtime's rule is compared, not idle
        plain = exported.model.caption(pictures, beam_size=options["beam_size"])
        assert [c.text for c in plain] != [c.text for c in expected]
    for want, have in zip(expected, got, strict=True):
        assert (have.tokens, have.words, have.text, have.finished) == (want.tokens, want.words, want.text,
                                                                       want.finished)
        assert have.score == pytest.approx(want.score, abs=1e-4)
        assert have.logprob == pytest.approx(want.logprob, abs=1e-4)
        assert have.attn.shape == tuple(want.attn.shape) and have.attn.dtype == np.float32
        np.testing.assert_allclose(have.attn, want.attn.numpy(), atol=1e-4)
        np.testing.assert_allclose(have.heatmaps(), want.heatmaps().numpy(), atol=1e-4)


def test_n_best_lists_equal_pytorch(exported: Exported, pictures: list, tmp_path: Path) -> None:
    paths = []
    for i, picture in enumerate(pictures[::2][:4]):
        paths.append(tmp_path / f"{i}.png")
        picture.save(paths[-1])
    expected = exported.model.caption(paths, n_best=3, beam_size=4)
    got = exported.runtime.caption(paths, n_best=3, beam_size=4)
    assert [[c.tokens for c in ranked] for ranked in got] == [[c.tokens for c in ranked] for ranked in expected]
    assert all(len(ranked) == 3 for ranked in got)
    for want, have in zip(expected, got):
        assert [c.score for c in have] == pytest.approx([c.score for c in want], abs=1e-4)
    with pytest.raises(ConfigError, match=r"n_best \(5\) must not exceed beam_size \(4\)"):
        exported.runtime.caption(paths, n_best=5, beam_size=4)


def test_a_single_image_gives_one_caption(exported: Exported, pictures: list) -> None:
    caption = exported.runtime.caption(pictures[1], beam_size=2)
    assert caption.tokens == exported.model.caption(pictures[1], beam_size=2).tokens


def test_the_manifest_describes_the_graphs(exported: Exported) -> None:
    import onnx

    folder = exported.folder / "onnx"
    manifest = json.loads((folder / "onnx.json").read_text())
    assert (manifest["format"], manifest["format_version"]) == (ONNX_FORMAT, ONNX_FORMAT_VERSION)
    model = exported.model
    spec = manifest["spec"]
    assert spec == model.spec(model.grid_size()).to_dict()  # the one description every model file carries
    assert spec["vocab"] == model.vocab.to_list() and spec["preprocessing"]["image_size"] == model.image_size == 32
    special = model.special_tokens
    assert [spec["special_tokens"][name] for name in ("bos", "eos")] == [special.bos, special.eos]
    assert [spec["special_tokens"][name] for name in ("pad", "bos", "unk")] == list(special.banned)
    assert spec["decode"]["beam_size"] == model.decode_config.beam_size
    kind = model.config.decoder.type
    assert spec["decoder"]["type"] == kind
    assert manifest["attention"] == ({"layers": 1, "heads": 1} if kind == "lstm" else {"layers": 2, "heads": 2})
    assert manifest["capacity"] == (None if kind == "lstm" else model.decode_config.max_length)
    assert manifest["state"] == (["h", "c"] if kind == "lstm" else ["k_0", "v_0", "k_1", "v_1", "pos"])
    for graph, entry in manifest["files"].items():
        path = folder / entry["path"]
        assert entry["sha256"] == sha256_of(path)
        proto = onnx.load(str(path))
        names = [i.name for i in proto.graph.input]
        assert names == manifest["graphs"][graph]["inputs"]
        assert all(i.type.tensor_type.shape.dim[0].dim_param == "batch" for i in proto.graph.input), graph


def test_the_runtime_preprocesses_to_the_transforms_bytes(exported: Exported, pictures: list) -> None:
    from captioner.data.image_files import picture_of

    for item in pictures:
        picture = picture_of(item)
        np.testing.assert_array_equal(image_array(picture, 32), exported.model.transform(picture).numpy())


def test_export_fails_when_onnxruntime_and_torch_disagree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model()
    export_onnx(model, tmp_path)
    specs, _ = onnx_export._graph_specs(model, capacity=5)
    paths = [tmp_path / "onnx" / onnx_export.GRAPH_FILES[spec.key] for spec in specs]
    assert onnx_export.check_parity(specs, paths) <= onnx_export.PARITY_TOLERANCE
    with torch.no_grad():
        model.decoder.init_h.bias.add_(0.5)  # torch changes after the graphs were written
    with pytest.raises(ExportError, match=r"decoder_init\.onnx output state\.h differs from torch"):
        onnx_export.check_parity(specs, paths)

    def failing_check(*args: object) -> float:
        raise ExportError("export: decoder_step.onnx output logprobs differs from torch")

    monkeypatch.setattr(onnx_export, "check_parity", failing_check)
    with pytest.raises(ExportError, match="differs from torch"):
        export_onnx(model, tmp_path)
    # no manifest vouches for graphs that failed (nor the old one)
    assert not (tmp_path / "onnx" / "onnx.json").exists()


def test_a_lite0_encoder_exports_and_captions_alike(tmp_path: Path, pictures: list) -> None:
    require_module("efficientnet_lite_pytorch", "the lite0 encoder needs efficientnet-lite-pytorch")
    model = tiny_model("model.encoder.name=efficientnet_lite0", "model.encoder.pretrained=false", "data.image_size=64")
    export_onnx(model, tmp_path)
    runtime = OnnxCaptioner.from_folder(tmp_path / "onnx", threads=1)
    assert runtime.grid == (2, 2)
    for want, have in zip(model.caption(pictures[:3], beam_size=2, max_length=5),
                          runtime.caption(pictures[:3], beam_size=2, max_length=5)):
        assert have.tokens == want.tokens and have.score == pytest.approx(want.score, abs=1e-4)


def test_a_pool_the_torchscript_exporter_refuses_goes_through_dynamo(tmp_path: Path, pictures: list) -> None:
    """A 4x4 feature map pooled to 3x3: TorchScript's exporter has no such adaptive pool; the
    dynamo exporter decomposes it, and the graph still reproduces torch."""
    model = tiny_model("model.encoder.grid_size=3", "data.image_size=64")
    export_onnx(model, tmp_path)
    manifest = json.loads((tmp_path / "onnx" / "onnx.json").read_text())
    assert (manifest["files"]["encoder"]["exporter"] == "dynamo" and manifest["files"]["decoder_step"]["exporter"]
            == "torchscript")
    # its trace's records (source files of this checkout) left out
    graph = (tmp_path / "onnx" / "encoder.onnx").read_bytes()
    assert b"pkg.torch.onnx.stack_trace" not in graph and str(REPO).encode() not in graph
    runtime = OnnxCaptioner.from_folder(tmp_path, threads=1)
    assert runtime.grid == (3, 3)
    for want, have in zip(model.caption(pictures[:3], beam_size=1, max_length=5),
                          runtime.caption(pictures[:3], beam_size=1, max_length=5)):
        assert have.tokens == want.tokens and have.score == pytest.approx(want.score, abs=1e-4)
        np.testing.assert_allclose(have.attn, want.attn.numpy(), atol=1e-4)


# --- the search's own rules, on a decoder given as a table of next-word log-probabilities ------------

BIGRAM_WORDS = ["<pad>", "<bos>", "<eos>", "<unk>", "a", "dog", "runs"]


def bigram_step(memory: dict, prev: np.ndarray, state: dict) -> tuple:
    """p(next | prev) from a fixed table: after <bos> "a"; after "a" <eos> beats "dog"; after
    "dog" <eos> beats "runs"; after "runs" <eos>. The state carries a counter to be reordered."""
    table = np.full((7, 7), -9.0, dtype=np.float32)
    table[1, 4] = -0.1  # <bos> -> a
    table[4, 2], table[4, 5] = -0.5, -1.0  # a -> <eos> | dog
    table[5, 2], table[5, 6] = -0.3, -2.0  # dog -> <eos> | runs
    table[6, 2] = -0.1  # runs -> <eos>
    attn = np.ones((len(prev), 1, 1, 2), dtype=np.float32) / 2  # (R, 1, 1, 2)
    return table[prev], attn, {"steps": state["steps"] + 1}


RULES = TokenRules(1, 2, np.isin(np.arange(7), [0, 1, 3]), np.array([w in BAD_ENDINGS for w in BIGRAM_WORDS]))


@pytest.mark.parametrize("search", [greedy_search, beam_search])
@pytest.mark.parametrize(
    ("min_length", "suppress", "words"),
    [(0, False, [4]), (0, True, [4, 5]), (3, False, [4, 5, 6]), (2, True, [4, 5])],
)
def test_min_length_and_bad_endings_hold_back_the_eos(search, min_length: int, suppress: bool,
                                                      words: list[int]) -> None:
    memory, state = {"image": np.zeros((2, 1), dtype=np.float32)}, {"steps": np.zeros(2, dtype=np.int64)}
    options = SearchOptions(beam_size=2, max_length=6, length_penalty=0.0, block_trigrams=False, min_length=min_length,
                            suppress_bad_endings=suppress)
    for hyp in search(bigram_step, memory, state, RULES, options):
        assert hyp.tokens == words and hyp.finished
        assert hyp.attn.shape == (len(words), 1, 1, 2)


def test_runtime_min_length_and_bad_endings(exported: Exported, pictures: list) -> None:
    plain = exported.runtime.caption(pictures, beam_size=3)
    assert min(len(c.words) for c in plain) < 6
    longer = exported.runtime.caption(pictures, beam_size=3, min_length=6, max_length=12)
    assert all(len(c.words) >= 6 for c in longer)
    for caption in exported.runtime.caption(pictures, beam_size=3, suppress_bad_endings=True):
        assert caption.words[-1] not in BAD_ENDINGS


# --- without torch, and bad input --------------------------------------------------------------------

BLOCK_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torchvision"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, NoTorch())
sys.argv = ["captioner.deploy", *sys.argv[1:]]
import runpy
try:
    runpy.run_module("captioner.deploy", run_name="__main__", alter_sys=True)
finally:
    assert not any(m.split(".")[0] == "torch" for m in sys.modules)
"""


def run_without_torch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH, *args], capture_output=True, text=True,
                          env=subprocess_env(), timeout=120)


def test_the_command_line_captions_without_torch(exported: Exported, pictures: list, tmp_path: Path) -> None:
    paths = []
    for i, item in enumerate(pictures[:3]):
        path = tmp_path / f"image{i}.png"
        (Image.open(io.BytesIO(item)) if isinstance(item, bytes) else item).save(path)
        paths.append(path)
    result = run_without_torch(str(exported.folder), *map(str, paths), "--beam", "2", "--max-length", "9")
    assert result.returncode == 0, result.stderr
    expected = exported.model.caption(paths, beam_size=2, max_length=9)
    assert result.stdout.splitlines() == [f"{path}\t{c.text}" for path, c in zip(paths, expected)]
    missing = tmp_path / "missing.png"  # named in one line, the others still captioned, then the count: exit 1
    result = run_without_torch(str(exported.folder), str(paths[0]), str(missing), "--beam", "2", "--max-length", "9")
    assert result.returncode == 1 and result.stdout.splitlines() == [f"{paths[0]}\t{expected[0].text}"]
    assert result.stderr.splitlines() == [f"error: {missing}: no such file", "1 of 2 images failed"]
    result = run_without_torch(str(exported.folder), str(missing), "--beam", "0")  # a mistake: one line, exit 2
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [
        "error: python -m captioner.deploy: argument --beam: beam_size must be a whole number in [1, 100]; got 0"]
    result = run_without_torch(str(exported.folder), str(missing))  # nothing to caption: one line, exit 2
    assert (result.returncode, result.stderr.splitlines()) == (2, [f"error: {missing}: no such file"])


def copy_of(exported: Exported, tmp_path: Path) -> Path:
    folder = tmp_path / "copy"
    shutil.copytree(exported.folder / "onnx", folder)
    return folder


def test_a_changed_or_missing_graph_is_one_line_naming_it(exported: Exported, tmp_path: Path) -> None:
    folder = copy_of(exported, tmp_path)
    with open(folder / "encoder.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ExportError, match=r"encoder\.onnx: sha256 does not match onnx\.json") as error:
        OnnxCaptioner.from_folder(folder)
    assert "\n" not in str(error.value)
    (folder / "decoder_step.onnx").unlink()
    shutil.copy(exported.folder / "onnx" / "encoder.onnx", folder / "encoder.onnx")
    with pytest.raises(ExportError, match=r"decoder_step\.onnx: missing \(listed in onnx\.json\)"):
        OnnxCaptioner.from_folder(folder)
    result = run_without_torch(str(folder), "any.png")  # the command line: one line, exit status 2
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "decoder_step.onnx: missing" in result.stderr


def test_graphs_that_do_not_fit_one_another_are_one_line_naming_the_graph(exported: Exported, tmp_path: Path) -> None:
    """An encoder swapped for one whose feats decoder_init cannot take (double, not float), its checksum recorded
    as a stranger would: onnxruntime's failure at the first caption is one line naming the graph, exit status 2."""
    import onnx
    from onnx import TensorProto, helper

    folder = copy_of(exported, tmp_path)
    size = exported.runtime.image_size
    shape = helper.make_tensor("shape", TensorProto.INT64, [3], [-1, 1, 3 * size * size])
    graph = helper.make_graph(
        [helper.make_node("Cast", ["images"], ["cast"], to=TensorProto.DOUBLE),
         helper.make_node("Reshape", ["cast", "shape"], ["feats"])], "encoder",
        [helper.make_tensor_value_info("images", TensorProto.UINT8, ["batch", 3, size, size])],
        [helper.make_tensor_value_info("feats", TensorProto.DOUBLE, ["batch", 1, 3 * size * size])], [shape])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              folder / "encoder.onnx")
    edit_json(folder / "onnx.json", {"files.encoder.sha256": sha256_of(folder / "encoder.onnx")})
    image = tmp_path / "photo.png"
    Image.new("RGB", (40, 30), (200, 30, 30)).save(image)
    with pytest.raises(ExportError, match=r"decoder_init\.onnx: onnxruntime failed running it \(.*\); re-") as error:
        OnnxCaptioner.from_folder(folder, threads=1).caption(image)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["encoder.onnx", "onnx.json", "the folder"])
def test_a_bundle_file_that_links_out_of_the_folder_is_refused_before_it_is_read(exported: Exported, tmp_path: Path,
                                                                                 name: str) -> None:
    """A graph, onnx.json or the onnx/ folder itself that is a link out of the folder the user named: a stranger's
    bundle would have the runtime read another file of the user's. One line naming the link, nothing opened."""
    folder, outside = tmp_path / "model", tmp_path / "outside"
    shutil.copytree(exported.folder, folder)
    if name == "the folder":
        shutil.move(folder / "onnx", outside)
        (folder / "onnx").symlink_to(outside, target_is_directory=True)
        name = "onnx.json"
    else:
        outside.mkdir()
        shutil.move(folder / "onnx" / name, outside / name)
        (folder / "onnx" / name).symlink_to(outside / name)
    with pytest.raises(ExportError) as error:
        OnnxCaptioner.from_folder(folder)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{folder / 'onnx' / name}: a link leading out of"), message

@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"format_version": 3}, r"onnx\.json: format_version 3 is another captioner version's ONNX format"),
        ({"format": "something-else"}, r"onnx\.json: not a captioner ONNX export"),
        ({"spec": "7x7"}, r"onnx\.json: field 'spec' is missing or malformed"),
        ({"spec.grid": "7x7"}, r"onnx\.json \(spec\): grid must be \[h, w\], got '7x7'"),
        ({"spec.vocab": ["<pad>", "<bos>", "<eos>", "<unk>", "a"]},
         r"onnx\.json: the step graph scores \d+ words, its vocab has 5"),
        ({"spec.special_tokens": {"pad": 0, "bos": 1, "eos": 99, "unk": 3}},
         r"onnx\.json \(spec\): special_tokens .* are not the vocabulary's"),
        # names, sizes and grid the graphs do not have: refused at load, not a traceback at the first caption
        ({"memory": ["zzz"]}, r"onnx\.json: memory \['zzz'\] and state .* are not the arrays its decoder graphs pass"),
        ({"state": []}, r"onnx\.json: memory .* and state \[\] are not the arrays its decoder graphs pass"),
        ({"spec.grid": [9, 9]}, r"onnx\.json: spec grid \[9, 9\], but the step graph attends to \d+ places"),
        ({"spec.preprocessing.image_size": 48}, r"onnx\.json: spec image_size 48, but encoder\.onnx takes \[32, 32\]"),
    ],
)
def test_a_manifest_from_another_version_or_edited_is_refused_in_one_line(exported: Exported, tmp_path: Path,
                                                                          edit: dict, message: str) -> None:
    folder = copy_of(exported, tmp_path)
    edit_json(folder / "onnx.json", edit)
    with pytest.raises(ExportError, match=message) as error:
        OnnxCaptioner.from_folder(folder)
    assert "\n" not in str(error.value)


def test_a_folder_without_an_export_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="no onnx.json here or in"):
        OnnxCaptioner.from_folder(tmp_path)
    (tmp_path / "onnx.json").write_text("{not json")
    with pytest.raises(ExportError, match=r"onnx\.json: not valid JSON"):
        OnnxCaptioner.from_folder(tmp_path)


def test_the_runtime_refuses_options_in_the_schemas_words(exported: Exported) -> None:
    """One decoding contract: each search option's bad values get the text DecodeOptions gives."""
    from captioner.core.decode_schema import OPTIONS
    from captioner.deploy.runtime import SEARCH_OPTIONS

    for name in SEARCH_OPTIONS:
        option = OPTIONS[name]
        for bad in (option.outside(option.kind), "x" if option.kind is not bool else 1):
            if bad is None:
                continue
            with pytest.raises(ConfigError) as error:
                exported.runtime.options(**{name: bad})
            assert str(error.value) == f"decode: {option.refusal(bad)}"
    with pytest.raises(ConfigError,
                       match=r"^decode: n_best \(4\) must not exceed beam_size \(3\); raise the beam or sample$"):
        exported.runtime.caption([], n_best=4, beam_size=3)


def test_bad_options_and_images_are_one_line(exported: Exported, tmp_path: Path, pictures: list) -> None:
    runtime = exported.runtime
    if runtime.capacity is not None:  # the transformer's cache holds `capacity` steps
        with pytest.raises(
                ConfigError,
                match=rf"max_length {runtime.capacity + 1} exceeds the {runtime.capacity} steps .*decoder_step\.onnx"):
            runtime.caption(pictures[0], max_length=runtime.capacity + 1)
    else:  # the LSTM's state has no length: longer captions than the default decode fine
        assert len(runtime.caption(pictures[0], max_length=40, beam_size=1).tokens) <= 40
    with pytest.raises(ConfigError, match="beam_size must be a whole number"):
        runtime.caption(pictures[0], beam_size=2.5)
    with pytest.raises(ConfigError, match="unknown option 'temperature'"):
        runtime.caption(pictures[0], temperature=0.5)
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(ImageLoadError, match="corrupt.jpg") as error:
        runtime.caption(corrupt)
    assert "\n" not in str(error.value)
    with pytest.raises(ImageLoadError, match="image 2 of 2"):
        runtime.caption([pictures[0], b"junk"])
    good = tmp_path / "good.png"
    pictures[0].save(good)
    results = runtime.caption([corrupt, good, tmp_path / "absent.png"], errors="return", beam_size=2)  # the rest go on
    assert isinstance(results[0], ImageLoadError) and isinstance(results[2],
                                                                 ImageLoadError) and "absent.png" in str(results[2])
    assert results[1].tokens == exported.model.caption(good, beam_size=2).tokens
    assert issubclass(ExportError, CaptionerError)


@pytest.mark.parametrize("threads", ["0", "-1", "1000000", "x"])
def test_a_thread_count_out_of_range_is_one_line_before_any_load(threads: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    """onnxruntime starts every thread it is given: --threads 1000000 hung the command, -1 passed unseen."""
    from captioner.deploy.__main__ import main

    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "export"), "photo.png", "--threads", threads])
    lines = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: python -m captioner.deploy: argument --threads: ") and threads in lines[0]


def test_the_runtime_given_an_image_where_the_export_goes_says_how_to_export_one(tmp_path: Path,
                                                                                 capsys: pytest.CaptureFixture) -> None:
    """The runtime ships no model: an image named first (as with `captioner caption photo.jpg`) is
    one line naming the file and the export command, with the packaged model's name when one is installed."""
    from captioner.deploy.__main__ import main
    from captioner.models.model_paths import packaged_models

    image = tmp_path / "photo.png"
    Image.new("RGB", (20, 20)).save(image)
    assert main([str(image), str(image)]) == 2
    line = capsys.readouterr().err.strip()
    name = packaged_models()[0].name if packaged_models() else "RUN"
    assert line == (f"error: {image}: a file, where the exported ONNX folder goes first; the runtime ships no model: "
                    f"export one with `captioner export {name} DIR --onnx` (PyTorch's captioner), then `captioner-onnx "
                    "DIR IMAGE...`")


def test_an_exported_folder_exports_to_onnx_for_the_runtime(tmp_path: Path) -> None:
    """`captioner export FOLDER DIR --onnx` on an exported folder (the packaged model's, say)
    writes the ONNX bundle, whose captions are the torch model's; without --onnx it is one line."""
    from captioner.apps.export import export_model
    from captioner.core.errors import ExportError

    model = briefly_trained("transformer", seed=3)
    model.save_pretrained(tmp_path / "exported")
    files = export_model(tmp_path / "exported", tmp_path / "for_runtime", onnx=True)
    assert {f.name for f in files} == {"encoder.onnx", "decoder_init.onnx", "decoder_step.onnx", "onnx.json"}
    runtime = OnnxCaptioner.from_folder(tmp_path / "for_runtime", threads=1)
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    assert runtime.caption(image, beam_size=2, max_length=6).text == model.caption(image, beam_size=2,
                                                                                   max_length=6).text
    with pytest.raises(ExportError, match="already an exported folder; .* with --onnx"):
        export_model(tmp_path / "exported", tmp_path / "again")
