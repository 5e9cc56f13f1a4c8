"""The decoders, one file each: its config dataclass and its module, registered together
(`@register_decoder`). Importing this package registers captioner's own."""

from captioner.models.decoders import lstm, transformer  # noqa: F401  (registers them)
