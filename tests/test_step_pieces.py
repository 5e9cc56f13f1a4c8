"""The training step's own pieces where torch's would do more work: the additive attention over all
steps of a recurrence (`RecurrentAttention`: its gradients are autograd's, also on a second backward,
its buffer reused from step to step and never shared), the CPU dropout's law, a caption batch that
needs no copy of the grid, the LSTM cell's weight gradient joined row by row, and gradient clipping
that skips its scaling by 1."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from captioner.data.batching import collate_captions
from captioner.models import recurrent_attention as attention_module
from captioner.models.attention import AdditiveAttention
from captioner.models.recurrent_attention import RecurrentAttention
from captioner.training.loop import clip_gradients
from captioner.models.decoders.lstm import LSTMConfig, LSTMDecoder
from captioner.models.dropout import Dropout

ACTIVE = [5, 5, 3, 3, 1]  # rows at each step: captions ending along the way


def run_steps(attention: AdditiveAttention, feats: torch.Tensor, start: torch.Tensor,
              recurrent: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A small recurrence: each step's query from the last context -> (loss, the steps' weights)."""
    projected = attention.project(feats)  # (B, N, A)
    attend = RecurrentAttention(attention, projected, ACTIVE) if recurrent else None
    state, loss, maps = start, torch.zeros(()), []
    for t, n in enumerate(ACTIVE):
        query = attention.state_proj(state[:n])  # (n, A)
        if attend is not None:
            context, weights = attend(t, feats[:n], query)
        else:
            context, weights = attention.attend(feats[:n], projected[:n], query)
        state = torch.tanh(context[:, : start.shape[1]] + state[:n])  # (n, S)
        loss = loss + (context * torch.linspace(-1, 1, context.numel()).view_as(context)).sum() + weights[:, 0].sum()
        maps.append(weights)
    return loss, maps


def setup() -> tuple[AdditiveAttention, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    attention = AdditiveAttention(feat_dim=8, state_dim=6, attention_dim=4)
    return attention, torch.randn(5, 7, 8, requires_grad=True), torch.randn(5, 6, requires_grad=True)


def grads_of(attention: AdditiveAttention, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [p.grad.clone() for p in attention.parameters()] + [t.grad.clone() for t in tensors]


def clear(attention: AdditiveAttention, *tensors: torch.Tensor) -> None:
    attention.zero_grad(set_to_none=True)
    for t in tensors:
        t.grad = None


def test_recurrent_attention_gives_autograds_numbers_also_on_a_second_backward() -> None:
    attention, feats, start = setup()
    loss, maps = run_steps(attention, feats, start, recurrent=False)
    loss.backward()
    want = grads_of(attention, feats, start)
    clear(attention, feats, start)
    got_loss, got_maps = run_steps(attention, feats, start, recurrent=True)
    assert torch.equal(got_loss, loss)  # the forward is `attend`'s arithmetic to the bit
    for got, map_ in zip(got_maps, maps, strict=True):
        assert torch.equal(got, map_)
    got_loss.backward(retain_graph=True)
    for got, w in zip(grads_of(attention, feats, start), want, strict=True):
        torch.testing.assert_close(got, w, atol=1e-6, rtol=1e-5)
    got_loss.backward()  # the slots hold gradients by now: each step makes its hidden layer again
    for got, w in zip(grads_of(attention, feats, start), want, strict=True):
        torch.testing.assert_close(got, 2 * w, atol=1e-6, rtol=1e-5)


def test_the_hidden_layers_buffer_is_reused_by_the_next_step_and_never_shared() -> None:
    attention, feats, start = setup()
    loss, _ = run_steps(attention, feats, start, recurrent=False)
    loss.backward()
    want = grads_of(attention, feats, start)
    taken = []
    take = attention_module._take_buffer

    def recording(owner, numel, like):  # type: ignore[no-untyped-def]
        buffer = take(owner, numel, like)
        taken.append(buffer.data_ptr())
        return buffer

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention_module, "_take_buffer", recording)
        for _ in range(2):  # two training steps: the second forward gets the first's buffer back,
            clear(attention, feats, start)  # the first graph still held (as the loop holds its loss)
            loss, _ = run_steps(attention, feats, start, recurrent=True)
            loss.backward()
        assert taken[0] == taken[1]
        del loss
        clear(attention, feats, start)
        first, _ = run_steps(attention, feats, start, recurrent=True)  # two graphs alive at once
        second, _ = run_steps(attention, feats, start, recurrent=True)
        assert taken[2] != taken[3]
        (first + second).backward()
    for got, w in zip(grads_of(attention, feats, start), want, strict=True):
        torch.testing.assert_close(got, 2 * w, atol=1e-6, rtol=1e-5)


def test_a_graph_dropped_without_backward_gives_its_buffer_back() -> None:
    attention, feats, start = setup()
    attention_module._SPARE.pop(attention, None)
    loss, maps = run_steps(attention, feats, start, recurrent=True)
    assert attention not in attention_module._SPARE
    del loss, maps
    gc.collect()
    assert attention_module._SPARE[attention].numel() == sum(ACTIVE) * 7 * 4  # rows x cells x A
    with torch.no_grad():  # without gradients: `attend` itself, no buffer taken
        assert not RecurrentAttention(attention, attention.project(feats), ACTIVE).deferred
    assert not RecurrentAttention(attention, torch.empty(5, 7, 4, device="meta"), ACTIVE).deferred  # off the CPU


def test_cpu_dropout_keeps_each_element_with_probability_one_minus_p_scaled_up() -> None:
    layer = Dropout(0.3).train()
    x = torch.full((400, 500), 2.0)
    torch.manual_seed(5)
    y = layer(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.005  # 200,000 draws: 5 standard deviations is 0.005
    assert torch.equal(y[kept], torch.full_like(y[kept], 2.0 / 0.7))
    torch.manual_seed(5)
    assert torch.equal(layer(x), y)  # the seed decides the mask
    assert layer(x.bfloat16()).dtype == torch.bfloat16
    off_cpu = layer(torch.empty(3, 4, device="meta"))  # nn.Dropout's own kernel: a CPU mask would not mix
    assert off_cpu.device.type == "meta" and off_cpu.shape == (3, 4)
    assert torch.equal(layer.eval()(x), x)
    assert Dropout(0.3).state_dict() == {} and repr(Dropout(0.3)) == repr(torch.nn.Dropout(0.3))


def test_a_caption_per_image_puts_the_images_in_the_captions_order_and_picks_no_rows() -> None:
    """One caption each: the images (and their indices) follow the captions, longest first, so the
    decoder reads each grid in place; several captions of an image: each caption names its image."""
    images = [torch.full((2, 3), float(i)) for i in range(3)]
    one_each = collate_captions([(images[i], [[1] * n], 10 + i) for i, n in enumerate((3, 5, 4))])
    assert one_each.image_rows is None and one_each.lengths.tolist() == [5, 4, 3]
    assert one_each.images[:, 0, 0].tolist() == [1.0, 2.0, 0.0] and one_each.indices.tolist() == [11, 12, 10]
    several = collate_captions([(images[i], [[1] * n, [1] * (n + 2)], 10 + i) for i, n in enumerate((3, 5))])
    assert several.image_rows.tolist() == [1, 0, 1, 0] and several.indices.tolist() == [10, 11]
    assert several.images[:, 0, 0].tolist() == [0.0, 1.0]


class CatInputs(TorchDispatchMode):
    """Whether each 2-D block aten.cat joins is row-major."""

    def __init__(self) -> None:
        super().__init__()
        self.row_major: list[bool] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops.aten.cat.default:
            self.row_major += [t.is_contiguous() for t in args[0] if t.dim() == 2 and t.shape[0] > 1]
        return func(*args, **(kwargs or {}))


def test_the_cells_input_weight_gradient_is_joined_from_row_major_blocks() -> None:
    """w_ih splits into the embedding's and the context's columns; gathering a column-major block
    into their joint gradient was 14 ms a step at the tutorial's sizes."""
    torch.manual_seed(0)
    decoder = LSTMDecoder(LSTMConfig(embed_dim=8, hidden_dim=12, attention_dim=6, dropout=0.0), 23, 10)
    logits = decoder(torch.randn(4, 9, 10), torch.randint(0, 23, (4, 5)), torch.tensor([5, 5, 3, 2])).logits
    with CatInputs() as cats:
        logits.sum().backward()
    assert cats.row_major and all(cats.row_major)


class ForeachMuls(TorchDispatchMode):
    """How many times gradients are scaled in place."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.calls += func in (torch.ops.aten._foreach_mul_.Tensor, torch.ops.aten._foreach_mul_.Scalar,
                               torch.ops.aten.mul_.Tensor, torch.ops.aten.mul_.Scalar)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("max_norm", [0.5, 50.0], ids=["clipped", "within"])
def test_clipping_is_torchs_to_the_bit_and_skips_a_scaling_by_one(max_norm: float) -> None:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(6, 4), torch.nn.Linear(4, 3, bias=False)]
    theirs = [torch.nn.Linear(6, 4), torch.nn.Linear(4, 3, bias=False)]
    for mine, other in zip(layers, theirs, strict=True):
        other.load_state_dict(mine.state_dict())
    x = torch.randn(5, 6)
    for pair in (layers, theirs):
        pair[1](pair[0](x)).pow(2).sum().mul(3).backward()
    params = [p for layer in layers for p in layer.parameters()]
    want_norm = torch.nn.utils.clip_grad_norm_([p for layer in theirs for p in layer.parameters()], max_norm)
    with ForeachMuls() as scaled:
        got_norm = clip_gradients(params, max_norm)
    assert torch.equal(got_norm, want_norm)
    for got, want in zip(params, [p for layer in theirs for p in layer.parameters()], strict=True):
        assert torch.equal(got.grad, want.grad)
    assert (scaled.calls > 0) == (max_norm < float(want_norm))  # scaled only when the norm is above max_norm

