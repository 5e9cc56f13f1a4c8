"""Self-attention recorded in decoding, the pointing game and Grad-CAM."""

from __future__ import annotations

import pytest
import torch

from captioner.evaluation.grounding import (
    caption_grad_cam,
    dilate,
    grad_cam,
    pointing_hits,
)
from helpers import tiny_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def transformer():
    return tiny_model("model.decoder.type=transformer", "model.decoder.num_layers=2", seed=3)


@pytest.mark.parametrize("beam", [1, 3])
def test_self_attention_is_the_one_decoding_used(transformer, beam):
    """The recorded weights equal a recomputation through the explicit softmax path on the same
    prefix; rows are distributions over <bos> and the earlier words, with nothing on later ones;
    asking for them changes no caption."""
    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    plain = transformer.caption(images, beam_size=beam, max_length=7)
    recorded = transformer.caption(images, beam_size=beam, max_length=7, self_attention=True)
    feats, _ = transformer.encode(images)
    for b, (p, c) in enumerate(zip(plain, recorded)):
        assert p.text == c.text and p.self_attn is None
        T = len(c.tokens)
        L, H = c.attn.shape[1:3]
        assert c.self_attn.shape == (T, L, H, T)
        inputs = torch.tensor([transformer.vocab.bos_id, *c.tokens[:-1]])[None]  # (1, T): the input at each step
        with torch.no_grad():
            out = transformer.decoder(feats[b : b + 1], inputs, self_attention=True)
        assert torch.allclose(c.self_attn, out.self_attn[0], atol=1e-5)  # (T, L, H, T)
        assert torch.allclose(c.self_attn.sum(dim=-1), torch.ones(T, L, H), atol=1e-5)
        later = torch.ones(T, T, dtype=torch.bool).triu(1)  # (T, T): column j > row t
        assert c.self_attn.permute(1, 2, 0, 3)[..., later].abs().max() == 0
        assert (c.self_attn.permute(1, 2, 0, 3)[..., ~later] > 0).all()  # the softmax reaches every earlier word


def test_self_attention_follows_the_beams(transformer):
    """n-best hypotheses each carry their own self-attention: the one of their own prefix."""
    images = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    feats, _ = transformer.encode(images)
    hyps = transformer.caption(images, n_best=3, beam_size=3, max_length=6, self_attention=True)[0]
    assert len({h.text for h in hyps}) == len(hyps) > 1
    for h in hyps:
        inputs = torch.tensor([transformer.vocab.bos_id, *h.tokens[:-1]])[None]
        with torch.no_grad():
            out = transformer.decoder(feats, inputs, self_attention=True)
        assert torch.allclose(h.self_attn, out.self_attn[0], atol=1e-5)


def test_lstm_has_no_self_attention():
    model = tiny_model()
    caption = model.caption(torch.rand(1, 3, 32, 32), max_length=4, self_attention=True)[0]
    assert caption.self_attn is None


def test_dilation_is_a_disk():
    mask = torch.zeros(64, 64, dtype=torch.bool)
    mask[32, 32] = True
    grown = dilate(mask, radius=15)
    assert grown[32, 47] and grown[17, 32] and not grown[32, 48]
    assert grown[32 + 10, 32 + 11] and not grown[32 + 11, 32 + 11]  # 14.9 px in, 15.6 px out


def test_pointing_game_inside_near_and_outside_the_mask():
    mask = torch.zeros(128, 128, dtype=torch.bool)
    mask[40:60, 40:60] = True  # a 20 x 20 object
    dilated = dilate(mask)

    def peak(y: int, x: int) -> torch.Tensor:
        m = torch.full((128, 128), 0.1)
        m[y, x] = 1.0
        return m

    maps = torch.stack([peak(50, 50), peak(50, 59 + 10), peak(50, 59 + 16), peak(100, 100)])  # (4, 128, 128)
    assert pointing_hits(maps, dilated).tolist() == [1.0, 1.0, 0.0, 0.0]
    # A flat map counts in expectation: the fraction of the image within 15 px of the mask.
    flat = pointing_hits(torch.ones(1, 128, 128), dilated)
    assert flat.item() == pytest.approx(dilated.float().mean().item())


@pytest.mark.parametrize(
    "grid, size",
    [((7, 7), (375, 500)), ((14, 14), (480, 640)), ((8, 8), (128, 128)), ((5, 3), (700, 33)), ((9, 9), (1, 1)),
     ((7, 7), (3, 2)), ((1, 1), (4, 4))],
)
def test_upsample_is_bilinear_interpolation(grid: tuple[int, int], size: tuple[int, int]) -> None:
    """The separable products give F.interpolate's bilinear maps, up and down, normalised to sum 1."""
    import torch.nn.functional as F

    from captioner.evaluation.grounding import upsample

    maps = torch.rand(3, *grid)  # (T, h, w)
    expected = F.interpolate(maps[:, None], size=size, mode="bilinear", align_corners=False)[:, 0]  # (T, H, W)
    torch.testing.assert_close(upsample(maps, size), expected / expected.sum(dim=(1, 2), keepdim=True),
                               rtol=1e-5, atol=1e-9)


def test_pointing_game_on_an_upsampled_grid_map():
    """A grid map whose peak cell covers the object hits; one whose peak is far off misses."""
    from captioner.evaluation.grounding import upsample

    grid = torch.full((8, 8), 0.01)
    grid[2, 3] = 1.0  # cell rows 32..47, columns 48..63
    image_map = upsample(grid[None], (128, 128))  # (1, 128, 128)
    index = int(image_map.flatten().argmax())
    assert 32 <= index // 128 < 48 and 48 <= index % 128 < 64  # the peak stays in its cell
    mask = torch.zeros(128, 128, dtype=torch.bool)
    mask[36:44, 52:60] = True
    assert pointing_hits(image_map, dilate(mask)).item() == 1.0
    far = torch.zeros(128, 128, dtype=torch.bool)
    far[100:120, 100:120] = True
    assert pointing_hits(image_map, dilate(far)).item() == 0.0


def test_grad_cam_of_a_toy_model_with_a_known_answer():
    """score = <v, A_k>: the gradient is v at cell k and 0 elsewhere, so the channel weights are
    v / N and the map is ReLU(A v) / N, peaking where the features align with v."""
    g = torch.Generator().manual_seed(0)
    N, D, k = 9, 5, 4
    v = torch.randn(D, generator=g)
    feats = torch.randn(2, N, D, generator=g)
    feats[1, 7] = 3 * v  # row 1: cell 7 is the one most aligned with v
    cam = grad_cam(lambda a: a[:, k] @ v, feats)  # (2, N)
    assert torch.allclose(cam, torch.relu(feats @ v) / N, atol=1e-6)
    assert int(cam[1].argmax()) == 7
    assert (cam >= 0).all()


def test_caption_grad_cam_matches_a_hand_computed_gradient(transformer):
    """Grad-CAM through the real decoder equals ReLU(mean-gradient-weighted features) computed by
    hand from the teacher-forced log-probability of one word."""
    images = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    caption = transformer.caption(images, max_length=5, beam_size=1)[0]
    feats, _ = transformer.encode(images)  # (1, N, D)
    t = len(caption.tokens) - 1
    cams = caption_grad_cam(transformer, feats[0], caption, [0, t])
    grid = feats.detach().clone().requires_grad_(True)
    tokens = torch.tensor([[transformer.vocab.bos_id, *caption.tokens]])
    logprob = transformer.decoder(grid, tokens).logits.log_softmax(-1)[0, t, caption.tokens[t]]
    (grad,) = torch.autograd.grad(logprob, grid)
    expected = torch.relu((grad.mean(dim=1, keepdim=True) * feats).sum(-1))[0]  # (N,)
    assert cams[t].shape == caption.attn.shape[-2:]
    assert torch.allclose(cams[t].flatten(), expected, atol=1e-5)
    assert not torch.allclose(cams[0], cams[t])


def test_per_head_scores_name_the_head_that_looks_at_the_object(tmp_path):
    """On a real shapes annotation: head 0 peaks on the named object, head 1 in the far corner;
    head 0 points and grounds, head 1 does not, and head 0 is named best. Grad-CAM maps given
    as saliency are scored alongside."""
    from captioner.data.shapes import generate_shapes
    from captioner.evaluation.grounding import Instances, interpret_scores
    from captioner.core.decode_results import Caption

    generate_shapes(tmp_path, 0, 0, 1, image_size=128, progress=False)
    instances = Instances(tmp_path / "instances_test.json")
    image_id = instances.coco.dataset["images"][0]["id"]
    obj = instances.objects(image_id)[0]
    shape = instances.category_names[obj["category_id"]]
    x, y, w, h = obj["bbox"]
    cell = (int((y + h / 2) // 16), int((x + w / 2) // 16))  # the 8 x 8 grid cell at the object's centre
    attn = torch.full((2, 1, 2, 8, 8), 0.001)  # (T, L, H, h, w): words "<colour> <shape>"
    attn[:, 0, 0, cell[0], cell[1]] = 1.0
    far = (7 - cell[0] // 4 * 7, 7 - cell[1] // 4 * 7)  # the opposite corner
    attn[:, 0, 1, far[0], far[1]] = 1.0
    attn = attn / attn.sum(dim=(-2, -1), keepdim=True)
    caption = Caption(f"{obj['colour']} {shape}", [obj["colour"], shape], [0, 0], 0.0, 0.0, attn, True)
    saliency = {image_id: {0: attn[0, 0, 0], 1: attn[1, 0, 1]}}
    report = interpret_scores({image_id: caption}, instances, "shapes", saliency)
    table = report.to_json()
    assert table["words"] == 2
    assert table["maps"]["L0H0"]["pointing"] == 1.0 and table["maps"]["L0H1"]["pointing"] == 0.0
    assert table["maps"]["L0H0"]["grounding"] > 5 * table["baselines"]["uniform_grounding"]
    assert table["maps"]["L0H1"]["grounding"] < table["baselines"]["uniform_grounding"]
    assert table["maps"]["gradcam"]["pointing"] == 0.5  # one word's map on the object, one off it
    assert table["best_head"] == "L0H0"
    assert (0 < table["baselines"]["random_point"] < 1
            and table["baselines"]["uniform_grounding"] < table["baselines"]["random_point"])


def test_cli_evaluate_grounding_per_head_and_caption_figures(tmp_path, capsys):
    """`evaluate --grounding --saliency gradcam` reports every head, their means, Grad-CAM and
    the baselines; `caption` writes the head view (PNG, SVG), the head grid and the Grad-CAM
    figure; an LSTM checkpoint asked for a head view gets a one-line error."""
    import json

    from captioner.apps.cli import main
    from captioner.data.shapes import generate_shapes
    from captioner.models.checkpoint import save_checkpoint

    generate_shapes(tmp_path / "shapes", 0, 0, 3, image_size=32, progress=False)
    model = tiny_model("model.decoder.type=transformer", f"data.root={tmp_path / 'shapes'}", "decode.max_length=6")
    checkpoint = tmp_path / "tf.pt"
    save_checkpoint(checkpoint, model)
    # saved outside a run folder: named, or the default data/shapes in the cwd
    shapes = f"data.root={tmp_path / 'shapes'}"
    code = main(["evaluate", str(checkpoint), shapes, "--split", "test", "--grounding", "--saliency", "gradcam",
                 "--fast", "--json", "--out", str(tmp_path / "eval")])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == 3  # this test's world
    heads = report["grounding"]["per_head"]
    if heads["words"]:  # a random model may name no object of its image
        assert {"L0H0", "L0H1", "L0 mean", "gradcam"} <= set(heads["maps"]) and heads["best_head"].startswith("L0H")
    image = sorted((tmp_path / "shapes" / "test").iterdir())[0]
    out = tmp_path / "figures"
    assert main(["caption", str(checkpoint), str(image), "--self-attention", str(out), "--head-grid", str(out),
                 "--heatmaps", str(out), "--saliency", "gradcam"]) == 0
    names = {p.name for p in out.iterdir()}
    stem = image.stem
    assert {f"{stem}_self_attention.png", f"{stem}_self_attention.svg", f"{stem}_heads.png",
            f"{stem}_gradcam.png"} <= names
    lstm = tmp_path / "lstm.pt"
    save_checkpoint(lstm, tiny_model())
    assert main(["caption", str(lstm), str(image), "--self-attention", str(out)]) != 0
    assert "needs a transformer checkpoint" in capsys.readouterr().err


def test_interpret_table_script(tmp_path):
    """scripts/interpret_table.py: one row per map kind, named in words, beside the baselines; a
    scores file without per-map grounding or an argument without LABEL= is one line, exit 2."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "interpret_table.py"
    maps = {"L0H0": (0.2, 0.5), "L0H1": (0.4, 0.75), "L0 mean": (0.3, 0.6), "gradcam": (0.1, 0.25)}
    per_head = {
        "words": 4, "pointing_tolerance_px": 15, "best_head": "L0H1",
        "baselines": {"uniform_grounding": 0.05, "random_point": 0.125, "centre_point": 0.25},
        "maps": {name: {"grounding": g, "pointing": p} for name, (g, p) in maps.items()},
    }
    scores = tmp_path / "scores_test.json"
    scores.write_text(json.dumps({"grounding": {"per_head": per_head}}))
    result = subprocess.run([sys.executable, str(script), f"TF={scores}"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[2:] == [
        "| TF | layer 0, head 0 | 0.200 | 0.050 | 0.500 | 0.125 | 0.250 |",
        "| TF | layer 0, head 1 (best) | 0.400 | 0.050 | 0.750 | 0.125 | 0.250 |",
        "| TF | layer 0, mean of heads | 0.300 | 0.050 | 0.600 | 0.125 | 0.250 |",
        "| TF | Grad-CAM | 0.100 | 0.050 | 0.250 | 0.125 | 0.250 |",
    ]
    (tmp_path / "plain.json").write_text(json.dumps({"overall": {"CIDEr": 0.5}}))
    for argument, message in ((f"X={tmp_path / 'plain.json'}", "no per-map grounding scores"),
                              (str(scores), "expected LABEL=SCORES_JSON")):
        failed = subprocess.run([sys.executable, str(script), argument], capture_output=True, text=True, timeout=60)
        assert (failed.returncode == 2 and failed.stdout == "" and message in failed.stderr
                and failed.stderr.count("\n") == 1)
