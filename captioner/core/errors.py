"""User-facing errors.

Every mistake a user can make (a bad path, a corrupt image, a malformed annotation file, a bad
config value, an incompatible checkpoint, a missing prerequisite) raises a subclass of
`CaptionerError` whose message is one line naming the problem, the file or field, and where it
helps the way out. The `captioner` command prints that line and exits 2, before its work where
the mistake can be seen then (`captioner/apps/prerequisites.py`); a partial failure (some images
captioned, some not) names each failure, then a count, and exits 1. Any other exception is a bug
and keeps its traceback. tests/test_error_contract.py walks every command through this.
"""


class CaptionerError(Exception):
    """Base class for errors caused by user input, reported as one line."""


class ImageLoadError(CaptionerError):
    """An image file is missing, corrupt, truncated, not an image, or too large."""


class DatasetError(CaptionerError):
    """A dataset or annotation file is missing or malformed."""


class ConfigError(CaptionerError):
    """A config file or override names an unknown key or an invalid value."""


class CheckpointError(CaptionerError):
    """A checkpoint is missing, corrupt, or incompatible with this version."""


class FeatureStoreError(CaptionerError):
    """A feature store is missing, unfinished, made by another encoder or for other images, or
    would not fit on the disk."""


class RequestError(CaptionerError):
    """A demo request carries a value outside what the page offers (beam, length, model, ...)."""


class ExportError(CaptionerError):
    """An exported model folder (Hub layout or ONNX) is missing a file, has a file that does not
    match its config or checksum, or was written by an incompatible version; or a Hub repo id
    cannot be reached (offline, no token)."""


class StorageError(CaptionerError):
    """A file could not be written: the disk is full (ENOSPC), or the file would exceed the
    process's size limit or the user's quota. The file it names was left as it was before."""
