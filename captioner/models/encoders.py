"""CNN encoders: an image batch -> a grid of feature vectors h_ij, any registered backbone's last map."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from captioner.core.config_sections import EncoderConfig
from captioner.data.image_transform import PixelNormalization, PixelStatistics
from captioner.models.backbones import check_encoder_config, pixel_statistics


class Encoder(nn.Module):
    """A backbone cut into blocks, an optional adaptive pool to a fixed grid, flattened cells; only the top
    `fine_tune_blocks` train (-1: all). A feature store keeps the frozen `trunk`'s output for `from_stored`."""

    def __init__(
        self, blocks: list[nn.Module], out_dim: int, config: EncoderConfig, fine_tune_blocks: int,
        statistics: PixelStatistics,
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.out_dim = out_dim
        self.config = config
        trainable = len(blocks) if fine_tune_blocks < 0 else min(fine_tune_blocks, len(blocks))
        self.num_frozen = len(blocks) - trainable
        for block in self.blocks[: self.num_frozen]:
            block.requires_grad_(False)
        # The normalisation's constants live on the weights' device, not in the state dict.
        self.normalize = PixelNormalization(statistics)
        # Channels-last: the layout oneDNN and cuDNN's tensor-core convolutions run in.
        self.to(memory_format=torch.channels_last)

    @property
    def frozen(self) -> bool:
        return self.num_frozen == len(self.blocks)

    @property
    def device(self) -> torch.device:
        return self.normalize.mean.device

    def train(self, mode: bool = True) -> Encoder:
        super().train(mode)
        for block in self.blocks[: self.num_frozen]:
            block.eval()
        return self

    def freeze(self) -> Encoder:
        """Freeze every block (no gradients, batch norms in eval mode)."""
        self.num_frozen = len(self.blocks)
        self.requires_grad_(False)
        return self.train(self.training)

    @property
    def storable(self) -> bool:
        """Whether a feature store can stand in for part of it: some block is frozen."""
        return self.num_frozen > 0

    def frozen_state_dict(self) -> dict[str, torch.Tensor]:
        """The frozen blocks' entries of the state dict: what stored rows depend on."""
        frozen = {f"blocks.{i}." for i in range(self.num_frozen)}
        return {name: t for name, t in self.state_dict().items() if name[: name.index(".", 7) + 1] in frozen}

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """images (B, 3, H, W), uint8 or normalised floats -> feats (B, N, D), grid (h, w), N = h * w."""
        return self.top(*self.cells(self.trunk(images), pool=self.frozen))

    def trunk(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W) -> the frozen blocks' feature map (B, C, h', w'), without gradients."""
        if images.dtype == torch.uint8:
            images = self.normalize(images)  # (B, 3, H, W) float32
        x = images.contiguous(memory_format=torch.channels_last)
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.num_frozen == 0):
            for block in self.blocks[: self.num_frozen]:
                x = block(x)
        return x

    def stored_part(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """images (B, 3, H, W) -> what the frozen blocks make (else the output), cells (B, n, C) on (h', w')."""
        if not self.storable:
            return self(images)
        return self.cells(self.trunk(images), pool=self.frozen)

    def from_stored(
        self, cells: torch.Tensor, grid: tuple[int, int] | None = None
    ) -> tuple[torch.Tensor, tuple[int, int]]:
        """`stored_part`'s cells (B, n, C) on `grid` (default: square) -> feats (B, N, D), grid (h, w)."""
        grid = grid or square_grid(cells.shape[1])
        return self.top(cells, grid) if self.storable else (cells, grid)

    def top(self, cells: torch.Tensor, grid: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
        """Cells (B, n, C) on `grid` -> feats (B, N, D), grid (h, w): the blocks that train, then the pool."""
        if self.frozen:
            return cells, grid
        B, n, C = cells.shape
        x = cells.reshape(B, *grid, C).permute(0, 3, 1, 2)  # (B, C, h', w'), channels-last strides: a view
        for block in self.blocks[self.num_frozen :]:
            x = block(x)
        return self.cells(x)

    def cells(self, x: torch.Tensor, pool: bool = True) -> tuple[torch.Tensor, tuple[int, int]]:
        """A feature map (B, D, h, w) -> its cells (B, h*w, D) and (h, w), pooled first when `pool`."""
        if pool and self.config.grid_size:
            x = F.adaptive_avg_pool2d(x, self.config.grid_size)  # (B, D, g, g)
        B, D, h, w = x.shape
        # (B, h*w, D), row-major and contiguous (a view when x is channels-last), for the per-step reads
        feats = x.permute(0, 2, 3, 1).reshape(B, h * w, D).contiguous()
        return feats, (h, w)


def square_grid(cells: int) -> tuple[int, int]:
    """(s, s) for `cells` = s * s; a ValueError otherwise (stored rows of another shape)."""
    side = math.isqrt(cells)
    if side * side != cells:
        raise ValueError(f"stored features: {cells} cells per image do not make a square grid")
    return side, side


def build_encoder(config: EncoderConfig, load_pretrained: bool = True) -> Encoder:
    """The encoder `config` describes; `load_pretrained=False` builds the architecture only."""
    spec = check_encoder_config(config)
    pretrained = config.pretrained and spec.pretrainable
    blocks = spec.build(config, pretrained and load_pretrained)
    fine_tune = config.fine_tune_blocks if pretrained else -1  # random weights must train
    return Encoder(blocks, spec.feature_dim(config), config, fine_tune, pixel_statistics(config))
