"""The GPU path under CUDA's rules, on the CPU (tests/cuda_semantics.py says how).

Every path a GPU run takes under bf16 autocast: the cross-entropy step and the SCST step
(forward, backward, optimiser) for both decoders and both baselines, greedy decoding, sampling,
beam search, grounding and Grad-CAM, under CUDA's dtype policy with real values; and the model's
forward passes on fake CUDA tensors, where any host/device mixing, device read or blocking copy
to the host raises. Beam search and greedy decoding, which read the device by design, run on fake
CUDA tensors that carry values, and their reads are counted.
"""

from __future__ import annotations

import pytest
import torch
from cuda_semantics import (
    AUTOCAST_DTYPE,
    DeviceRead,
    autocast_ops,
    cuda_autocast,
    cuda_policies,
    fake_cuda,
    op_dtypes,
    to_fake_cuda,
)
from helpers import TINY_MODEL, WORDS, tiny_model
from torch._subclasses.fake_tensor import DataDependentOutputException

from captioner.core.config import load_config
from captioner.data.batching import collate_captions
from captioner.training.loop import caption_loss

DECODERS = ["lstm", "transformer"]


def caption_batch(model, n_images: int = 3, lengths: tuple[int, ...] = (7, 5, 3)):
    """A training batch of 32 px uint8 images, one caption each, longest first (as collate gives)."""
    torch.manual_seed(1)
    items = []
    for i in range(n_images):
        words = " ".join(WORDS[i : i + lengths[i % len(lengths)]])
        # as ImageTransform gives it: normalised on the device
        image = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8)
        items.append((image, [model.vocab.encode(words, 20)], i))
    return collate_captions(items)


# -- the emulation itself ------------------------------------------------------------------


def test_the_cuda_lists_are_the_ones_torch_registers_for_cuda() -> None:
    """The header's lists name the ops with AutocastCUDA kernels, bar a few registered apart
    (binary_cross_entropy, banned; norm, re-dispatched with a dtype; cuDNN's RNN and convolution
    kernels, reached only after conv2d / lstm have cast; linalg_matrix_sqrth), so a torch whose
    lists moved fails here rather than emulating an old policy."""
    parsed = set(cuda_policies())
    registered = autocast_ops("AutocastCUDA")
    apart = {n for n in registered if n.startswith(("aten::norm", "aten::binary_cross_entropy"))}
    apart |= {"aten::_cudnn_rnn", "aten::cudnn_convolution", "aten::cudnn_convolution_transpose",
              "aten::linalg_matrix_sqrth"}
    assert registered - apart <= parsed, registered - apart - parsed
    assert {n for n in parsed if n.startswith("aten::")} - registered <= {n for n in parsed
                                                                          if "Dimname" in n}, parsed - registered


@pytest.mark.parametrize(
    "name, run, cuda_dtype",
    [
        ("softmax", lambda x: x.softmax(-1), torch.float32),  # CUDA: float32; CPU autocast: bf16
        ("log_softmax", lambda x: x.log_softmax(-1), torch.float32),
        ("sum", lambda x: x.sum(), torch.float32),
        ("layer_norm", lambda x: torch.nn.functional.layer_norm(x, (4,)), torch.float32),
        ("exp", lambda x: x.exp(), torch.float32),
        ("cat", lambda x: torch.cat([x, x.float()]), torch.float32),  # CUDA: type promotion, not autocast
        ("matmul", lambda x: x.float() @ x.float(), AUTOCAST_DTYPE),
        ("addcmul", lambda x: torch.addcmul(x, x.float(), x.float()), torch.float32),  # CUDA's promote list
    ],
)
def test_the_emulation_gives_cudas_dtypes(name: str, run, cuda_dtype: torch.dtype) -> None:
    """Each op's output dtype under the emulation equals the real AutocastCUDA kernel's (on fake
    CUDA tensors); several differ from what CPU autocast gives."""
    with cuda_autocast():
        emulated = run(torch.randn(4, 4, dtype=AUTOCAST_DTYPE)).dtype
    with fake_cuda():
        real_cuda = run(torch.randn(4, 4, dtype=AUTOCAST_DTYPE, device="cuda")).dtype
    assert emulated == real_cuda == cuda_dtype


def test_index_copy_is_not_promoted_as_on_cuda() -> None:
    """The GPU crash the CPU never showed: CPU autocast promotes index_copy, CUDA's does not."""
    buffer, rows = torch.zeros(4, 3, dtype=torch.bfloat16), torch.tensor([0, 2])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert buffer.index_copy(0, rows, torch.ones(2, 3)).dtype == torch.float32  # silently widened
    with cuda_autocast(), pytest.raises(RuntimeError, match="same dtype"):
        buffer.index_copy(0, rows, torch.ones(2, 3))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the kernels are gone after the block
        assert buffer.index_copy(0, rows, torch.ones(2, 3)).dtype == torch.float32


def test_fake_cuda_catches_host_device_mixing_and_device_reads() -> None:
    with fake_cuda():
        x = torch.randn(3, 4, device="cuda")
        assert x.device.type == "cuda"
        with pytest.raises(RuntimeError, match="device"):
            x + torch.ones(3, 4, device="cpu")
        with pytest.raises(DataDependentOutputException):  # the host would wait for the GPU here
            bool(x.sum() > 0)


# -- the training step ---------------------------------------------------------------------


@pytest.mark.parametrize("decoder", DECODERS)
def test_cross_entropy_step_under_cuda_autocast(decoder: str) -> None:
    """Forward in autocast (as train_one_epoch runs it on a GPU), backward, an optimiser step:
    finite loss, float32 gradients on every trained weight."""
    model = tiny_model(f"model.decoder.type={decoder}").train()
    config = load_config(None, [*TINY_MODEL, f"model.decoder.type={decoder}"])
    batch = caption_batch(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with cuda_autocast():
        loss, parts = caption_loss(model, batch, config, encoded=False)
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and loss.dtype == torch.float32
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("decoder", DECODERS)
def test_the_two_layers_agree_op_by_op(decoder: str) -> None:
    """The model's teacher-forced forward under the emulation runs the same ops, in the same
    order and the same dtypes, as under the real CUDA autocast kernels on fake CUDA tensors.
    Without a GPU, CUDA's fused attention falls back to its math path, so the emulation is
    asked for the same path (on a GPU the fused kernel returns the same dtype)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = tiny_model(f"model.decoder.type={decoder}")
    batch = caption_batch(model)
    lengths = batch.lengths - 1  # the training loss's call: lengths on the host, packed logits
    with cuda_autocast(), sdpa_kernel(SDPBackend.MATH), op_dtypes() as emulated:
        model(batch.images, batch.tokens[:, :-1], batch.image_rows, lengths=lengths, packed=True)
    with fake_cuda() as mode:
        to_fake_cuda(model, mode)
        images, tokens = batch.images.to("cuda"), batch.tokens.to("cuda")
        rows = None if batch.image_rows is None else batch.image_rows.to("cuda")
        with op_dtypes() as real_cuda:  # the tokens cut on the device, as the loss cuts them there
            model(images, tokens[:, :-1], rows, lengths=lengths, packed=True)
    assert len(emulated.trace) > 100
    assert emulated.trace == real_cuda.trace
    assert ("aten.bmm.default", (AUTOCAST_DTYPE,)) in emulated.trace  # autocast really ran


@pytest.mark.parametrize("decoder", DECODERS)
def test_teacher_forced_forward_on_fake_cuda(decoder: str) -> None:
    """The cross-entropy forward on CUDA tensors with host lengths (as train_one_epoch passes
    them): no CPU tensor is mixed into a device op and no device value is read; the loss comes
    out in float32, the attention maps in float32 (CUDA's softmax), the logits in bf16."""
    model = tiny_model(f"model.decoder.type={decoder}").train()
    config = load_config(None, [*TINY_MODEL, f"model.decoder.type={decoder}"])
    batch = caption_batch(model)
    with fake_cuda() as mode:
        to_fake_cuda(model, mode)
        loss, parts = caption_loss(model, batch.to(torch.device("cuda")), config, encoded=False)
        assert mode.blocking_copies == []
        out = model(batch.images.to("cuda"), batch.tokens[:, :-1].to("cuda"), lengths=batch.lengths - 1)
    assert loss.device.type == "cuda" and loss.dtype == torch.float32
    assert out.logits.dtype == AUTOCAST_DTYPE and out.attn.dtype == torch.float32


@pytest.mark.parametrize("decoder", DECODERS)
def test_decoder_steps_on_fake_cuda(decoder: str) -> None:
    """prepare, init_state, step and the beam reordering, as beam search and SCST drive them,
    on CUDA tensors: no host/device mixing, no device read."""
    from captioner.models.decoder import select_rows

    model = tiny_model(f"model.decoder.type={decoder}")
    with fake_cuda() as mode:
        to_fake_cuda(model, mode)
        feats = torch.randn(2, 16, model.encoder.out_dim, device="cuda")  # (B, N, D)
        memory = select_rows(model.decoder.prepare(feats), torch.arange(2, device="cuda").repeat_interleave(3))  # K = 3
        state = model.decoder.init_state(memory)
        prev = torch.full((6,), model.vocab.bos_id, device="cuda")
        for _ in range(4):
            logprobs, attn, state = model.decoder.step(memory, prev, state)
            prev = logprobs.argmax(dim=-1)  # (6,)
            state = select_rows(state, torch.tensor([2, 0, 1, 5, 3, 4], device="cuda"))
    assert logprobs.shape == (6, len(model.vocab)) and attn.dtype == torch.float32


@pytest.mark.parametrize("decoder", DECODERS)
def test_scst_sampling_on_fake_cuda(decoder: str) -> None:
    """Sampling the SCST captions reads nothing back from the device: it runs to the end on
    CUDA tensors without values (the old loop's `bool(done.all())` raised here)."""
    from captioner.models.decoding import DecodeOptions, SpecialTokens
    from captioner.models.decoding.sampling import sample_captions

    model = tiny_model(f"model.decoder.type={decoder}").train()
    vocab = model.vocab
    with fake_cuda() as mode:
        to_fake_cuda(model, mode)
        feats = torch.randn(2, 16, model.encoder.out_dim, device="cuda")
        special = SpecialTokens(vocab.bos_id, vocab.eos_id, (vocab.pad_id, vocab.bos_id))
        samples = sample_captions(model.decoder, feats, special, DecodeOptions(sample=True, n_best=3, max_length=6))
        loss = -samples.caption_logprobs().mean()
    assert mode.blocking_copies == []
    assert samples.tokens.device.type == "cuda" and samples.tokens.shape[0] == 6
    assert loss.dtype == torch.float32


@pytest.mark.parametrize("baseline", ["greedy", "mean"])
@pytest.mark.parametrize("decoder", DECODERS)
def test_scst_step_under_cuda_autocast(decoder: str, baseline: str) -> None:
    """The self-critical step as train_one_epoch runs it on a GPU: sampling, the greedy
    baseline's decoding and the reward inside bf16 autocast, then backward: a finite loss and
    float32 gradients."""
    from captioner.core.config_sections import ScstConfig
    from captioner.training.scst import SelfCritical

    model = tiny_model(f"model.decoder.type={decoder}").train()
    config = load_config(
        None, [*TINY_MODEL, f"model.decoder.type={decoder}", "train.stage=scst", f"scst.baseline={baseline}"])
    batch = caption_batch(model)
    references = [[" ".join(WORDS[i : i + 4]), " ".join(WORDS[i + 1 : i + 6])] for i in range(3)]
    objective = SelfCritical(ScstConfig(samples=3, max_length=8, baseline=baseline), model.vocab, references)
    with cuda_autocast():
        loss, logged = objective(model, batch, config, encoded=False)
    loss.backward()
    assert torch.isfinite(loss) and loss.dtype == torch.float32
    assert all(torch.isfinite(v) for v in logged.values())
    grads = [p.grad for p in model.decoder.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 for g in grads)


@pytest.mark.parametrize("decoder", DECODERS)
def test_inference_under_cuda_autocast(decoder: str) -> None:
    """Greedy decoding, sampling (top-k, top-p, trigram blocking) and beam search (plain,
    diverse, n-best) under the GPU's autocast policy: every caption's words line up with
    float32 maps that are distributions over the grid."""
    model = tiny_model(f"model.decoder.type={decoder}")
    images = caption_batch(model).images
    runs = [
        {"beam_size": 1},
        {"sample": True, "n_best": 2, "top_k": 5, "top_p": 0.9, "block_trigrams": True, "seed": 0},
        {"beam_size": 3, "n_best": 2, "length_penalty": 0.6},
        {"beam_size": 4, "diverse_groups": 2, "n_best": 2},
    ]
    for options in runs:
        n_best = options.pop("n_best", 1)
        with cuda_autocast():
            captions = model.caption(images, n_best=n_best, max_length=6, **options)
        for caption in (c for per_image in captions for c in per_image):
            assert caption.attn.dtype == torch.float32 and caption.attn.shape[0] == len(caption.words)
            sums = caption.attn.flatten(-2).sum(-1)  # (T, L, H)
            assert torch.allclose(sums, torch.ones_like(sums), atol=1e-2), options


def test_grounding_and_grad_cam_under_cuda_autocast(tmp_path) -> None:
    """Grad-CAM (a backward pass through the decoder) and the grounding score on a caption
    decoded under the GPU's autocast policy: maps of the grid's shape, finite, the grounding
    mass a fraction."""
    from captioner.data.shapes import generate_shapes
    from captioner.evaluation.grounding import Instances, caption_grad_cam, grounding_score

    generate_shapes(tmp_path, num_train=0, num_val=0, num_test=2, image_size=32, seed=1, progress=False)
    instances = Instances(tmp_path / "instances_test.json")
    model = tiny_model("model.decoder.type=transformer")
    image_id = sorted(instances.coco.imgs)[0]
    objects = instances.objects(image_id)
    words = []
    for o in objects:
        words += ["a", o["colour"], instances.category_names[o["category_id"]]]
    torch.manual_seed(0)
    images = torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8)
    with cuda_autocast():
        feats, grid = model.encode(images)
        caption = model.decode(feats, grid, beam_size=1, max_length=6)[0]
        forced = model.decode(feats, grid, beam_size=1, max_length=len(words))[0]
        forced.words, forced.tokens = words, [model.vocab.index.get(w, model.vocab.unk_id) for w in words]
        forced.attn = forced.attn[:1].expand(len(words), *forced.attn.shape[1:])
        cams = caption_grad_cam(model, feats[0], caption, list(range(len(caption.words))))
        report = grounding_score({image_id: forced}, instances)
    assert cams and all(c.shape == grid and torch.isfinite(c).all() for c in cams.values())
    assert report.words == len(objects) * 2 and 0.0 <= report.score <= 1.0  # a colour and a shape word per object


@pytest.mark.parametrize("baseline", ["greedy", "mean"])
@pytest.mark.parametrize("decoder", DECODERS)
def test_scst_objective_on_fake_cuda(decoder: str, baseline: str, tmp_path) -> None:
    """The whole SCST forward (encoding, sampling, the greedy baseline, the CIDEr-D reward from
    the reference table, the loss and the logged values) on CUDA tensors without values: any
    device read raises here, and nothing is mixed in from the host."""
    from captioner.core.config_sections import ScstConfig
    from captioner.training.scst import SelfCritical

    model = tiny_model(f"model.decoder.type={decoder}").train()
    config = load_config(
        None, [*TINY_MODEL, f"model.decoder.type={decoder}", "train.stage=scst", f"scst.baseline={baseline}"])
    batch = caption_batch(model)
    references = [[" ".join(WORDS[i : i + 4]), " ".join(WORDS[i + 1 : i + 6])] for i in range(3)]
    objective = SelfCritical(ScstConfig(samples=3, max_length=8, baseline=baseline), model.vocab, references,
                             cache_dir=tmp_path)
    with fake_cuda() as mode:
        to_fake_cuda(model, mode)
        objective(model, batch.to(torch.device("cuda")), config, encoded=False)  # copies the reward's table, once
        mode.blocking_copies.clear()
        loss, logged = objective(model, batch.to(torch.device("cuda")), config, encoded=False)
    assert loss.device.type == "cuda" and loss.dtype == torch.float32
    assert all(v.device.type == "cuda" for v in logged.values())
    assert mode.blocking_copies == []  # a step after the first copies nothing that waits


def test_fake_cuda_catches_copies_to_the_host() -> None:
    """A blocking copy from the device to the host waits for every queued kernel, as a value read
    does: `.cpu()`, `.to("cpu")` and `copy_` into a host tensor raise; a non-blocking one (into
    pinned memory) and host-to-host copies do not."""
    with fake_cuda():
        x = torch.randn(3, device="cuda")
        copies = (lambda: x.cpu(), lambda: x.to("cpu"), lambda: x.to(torch.device("cpu"), torch.float64),
                  lambda: torch.zeros(3).copy_(x))
        for copy in copies:
            with pytest.raises(DeviceRead, match="from the device to the host"):
                copy()
        assert x.to("cpu", non_blocking=True).device.type == "cpu"
        assert torch.equal(torch.zeros(2).copy_(torch.ones(2)), torch.ones(2))


def test_scst_with_the_reward_copied_to_the_host_fails_on_fake_cuda(tmp_path) -> None:
    """The mistake tests/test_sync.py's HostReward makes (the reward brought to the host with
    `.cpu()` and sent back without blocking) stops the SCST forward where the reward is scored."""
    from test_sync import HostReward

    from captioner.core.config_sections import ScstConfig
    from captioner.training.device_reward import DeviceReward
    from captioner.training.scst import SelfCritical

    model = tiny_model("model.decoder.type=lstm").train()
    config = load_config(None, [*TINY_MODEL, "model.decoder.type=lstm", "train.stage=scst"])
    batch = caption_batch(model)
    references = [[" ".join(WORDS[i : i + 4]), " ".join(WORDS[i + 1 : i + 6])] for i in range(3)]
    reward = HostReward(DeviceReward(model.vocab, references))
    objective = SelfCritical(ScstConfig(samples=3, max_length=8), model.vocab, references, reward)
    with fake_cuda() as mode, pytest.raises(DeviceRead, match=r"scst\.py:\d+"):
        to_fake_cuda(model, mode)
        objective(model, batch.to(torch.device("cuda")), config, encoded=False)


def test_fake_cuda_with_values_reads_what_a_gpu_would() -> None:
    """With values, device tensors compute on CPU shadows beside the fake ops: reads give the
    numbers and are recorded in order (`.tolist()` once, however long), nothing else is."""
    with fake_cuda(values=True) as mode:
        x = torch.arange(6.0).to("cuda", non_blocking=True).view(2, 3) * 2  # (2, 3)
        x[:, 0] = -1.0
        assert x.device.type == "cuda" and mode.device_reads == []
        assert x.tolist() == [[-1.0, 2.0, 4.0], [-1.0, 8.0, 10.0]]
        assert x.sum().item() == 22.0 and bool((x > 9).any())
        assert (x > 3).nonzero().shape == (3, 2)
        host = x.cpu()
        assert type(host) is torch.Tensor and torch.equal(host, torch.tensor([[-1.0, 2.0, 4.0], [-1.0, 8.0, 10.0]]))
        x.to("cpu", non_blocking=True)  # no wait: not a read
    assert [r.split(" at ")[0] for r in mode.device_reads] == [
        "tolist", "aten._local_scalar_dense.default", "aten._local_scalar_dense.default", "aten.nonzero.default",
        "aten._to_copy.default",
    ]


def eos_prone(model):
    """The model with <eos> made likely, so that hypotheses end and searches stop before
    max_length (an untrained model rarely ends a caption)."""
    out = model.decoder.out_vocab if hasattr(model.decoder, "out_vocab") else model.decoder.out
    with torch.no_grad():
        out.bias[model.vocab.eos_id] += 3.0
    return model


def counting_steps(model, mode) -> None:
    """Mark each decoder step in mode.device_reads, so that the reads can be split by step."""
    step = model.decoder.step

    def counted(*args, **kwargs):
        mode.device_reads.append("step")
        return step(*args, **kwargs)

    model.decoder.step = counted


def reads_per_step(reads: list[str]) -> tuple[list[str], list[list[str]]]:
    """mode.device_reads split at the step markers: the reads before the first step, and the reads
    from each step to the next (the last step's: to the end), file:line cut to the file."""
    marks = [i for i, r in enumerate(reads) if r == "step"]
    cut = lambda part: [r.rsplit(":", 1)[0] for r in part]  # noqa: E731
    return cut(reads[: marks[0]]), [cut(reads[i + 1 : j]) for i, j in zip(marks, [*marks[1:], len(reads)])]


def same_hypotheses(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.tokens == w.tokens and g.score == w.score and g.logprob == w.logprob and g.finished == w.finished
        assert g.attn.device.type == "cpu" and torch.equal(g.attn, w.attn)
        assert (g.self_attn is None) == (w.self_attn is None) and (g.self_attn is None
                                                                   or torch.equal(g.self_attn, w.self_attn))


@pytest.mark.parametrize("decoder", DECODERS)
def test_beam_search_on_fake_cuda(decoder: str) -> None:
    """The real `beam_search` and `beam_search_n_best` (diverse, n-best) on CUDA tensors that
    carry values: every word of every hypothesis as under the emulated CUDA policy on the CPU
    (the same ops in the same dtypes, bit for bit), with one read of the device per step (the
    host's bookkeeping: hypotheses live on the host by design, and the search stops early) and
    one copy of the returned maps after it; no blocking copy to the device. With self_attention,
    the transformer's step reads its position once more per step (a documented inspection path)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from captioner.models.decoding import DecodeOptions, SpecialTokens, beam_search, beam_search_n_best

    model = eos_prone(tiny_model(f"model.decoder.type={decoder}"))
    special = SpecialTokens.of(model.vocab)
    torch.manual_seed(0)
    feats = torch.randn(3, 16, model.encoder.out_dim)  # (B, N, D)
    runs = [
        (beam_search, DecodeOptions(beam_size=3, max_length=8, length_penalty=0.6, min_length=2)),
        (
            beam_search_n_best,
            DecodeOptions(beam_size=4, diverse_groups=2, n_best=2, max_length=8, min_length=1, block_trigrams=True,
                          self_attention=True),
        ),
    ]
    for search, options in runs:
        with cuda_autocast(), sdpa_kernel(SDPBackend.MATH):  # fake CUDA has no fused attention kernel either
            want = search(model.decoder, feats, special, options)
        fake_model = tiny_model(f"model.decoder.type={decoder}")
        fake_model.load_state_dict(model.state_dict())
        with fake_cuda(values=True) as mode:
            to_fake_cuda(fake_model, mode)
            counting_steps(fake_model, mode)
            got = search(fake_model.decoder, feats.to("cuda", non_blocking=True), special, options)
        flat = lambda hyps: (  # noqa: E731
            [h for per_image in hyps for h in per_image] if isinstance(hyps[0], list) else hyps)
        same_hypotheses(flat(got), flat(want))
        assert all(h.finished and h.tokens for h in flat(want))  # ended after a word or more: their maps were gathered
        before, per_step = reads_per_step(mode.device_reads)
        assert before == [] and 1 < len(per_step) < options.max_length, mode.device_reads  # it stopped early
        self_read = options.self_attention and decoder == "transformer"
        in_step = ["aten._local_scalar_dense.default at transformer.py"] if self_read else []
        after = ["aten._to_copy.default at beam.py"] * (2 if self_read else 1)  # the maps (and the self-attention)
        for i, reads in enumerate(per_step):
            assert reads == [*in_step, "tolist at beam.py", *(after if i == len(per_step) - 1 else [])], per_step
        assert mode.blocking_copies == []


@pytest.mark.parametrize("decoder", DECODERS)
def test_greedy_decoding_on_fake_cuda(decoder: str) -> None:
    """`sample_captions` without `sample` (SCST's greedy baseline, with the ending rule) runs on
    fake CUDA tensors without values, so it reads nothing, and with values gives the emulation's words. The
    inference's `greedy_decode` reads the device once per step (its early exit) and then copies
    what the host keeps once each."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from captioner.models.decoding import DecodeOptions, SpecialTokens, greedy_decode
    from captioner.models.decoding.sampling import sample_captions

    model = eos_prone(tiny_model(f"model.decoder.type={decoder}"))
    special = SpecialTokens.of(model.vocab)
    torch.manual_seed(0)
    feats = torch.randn(4, 16, model.encoder.out_dim)  # (B, N, D)

    def baseline(decoder_, feats_):
        greedy = DecodeOptions(max_length=8, min_length=2, suppress_bad_endings=True)
        return sample_captions(decoder_, feats_, special, greedy)

    options = DecodeOptions(beam_size=1, max_length=8, min_length=1)
    with cuda_autocast(), sdpa_kernel(SDPBackend.MATH):
        want, want_hyps = baseline(model.decoder, feats), greedy_decode(model.decoder, feats, special, options)
    with fake_cuda() as mode:
        plain = tiny_model(f"model.decoder.type={decoder}")
        to_fake_cuda(plain, mode)
        captions = baseline(plain.decoder, feats.to("cuda", non_blocking=True))  # any read would raise here
        assert captions.tokens.device.type == "cuda" and captions.tokens.shape == (4, 8)
        assert mode.blocking_copies == []
    fake_model = tiny_model(f"model.decoder.type={decoder}")
    fake_model.load_state_dict(model.state_dict())
    with fake_cuda(values=True) as mode:
        to_fake_cuda(fake_model, mode)
        on_device = feats.to("cuda", non_blocking=True)
        got = baseline(fake_model.decoder, on_device)
        assert mode.device_reads == []
        tokens, mask = got.tokens.cpu(), got.mask.cpu()
        counting_steps(fake_model, mode)
        mode.device_reads.clear()
        got_hyps = greedy_decode(fake_model.decoder, on_device, special, options)
    assert torch.equal(tokens, want.tokens) and torch.equal(mask, want.mask) and (want.tokens == special.eos).any()
    same_hypotheses(got_hyps, want_hyps)
    _, per_step = reads_per_step(mode.device_reads)
    assert 1 < len(per_step) < 8  # every caption ended before max_length
    assert all(reads == ["aten._local_scalar_dense.default at sampling.py"] for reads in per_step[:-1]), per_step
    assert per_step[-1][0] == "aten._local_scalar_dense.default at sampling.py" and len(per_step[-1]) == 6, per_step[-1]


def test_fake_cuda_records_copies_to_the_device_that_would_wait() -> None:
    with fake_cuda() as mode:
        torch.tensor([1, 2], device="cuda")  # from a Python list: a blocking copy
        torch.zeros(3).to("cuda")
        torch.zeros(3).to("cuda", non_blocking=True)  # does not wait
        torch.zeros(3, device="cuda").copy_(torch.ones(3), non_blocking=True)
    assert len(mode.blocking_copies) == 2, mode.blocking_copies
