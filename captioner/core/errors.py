"""User-facing errors: a `CaptionerError` is one line naming the problem, the file or field and the way
out; `captioner` prints it and exits 2. Any other exception is a bug and keeps its traceback.
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
    """An exported model folder is missing a file, has one that does not match its config or checksum,
    or comes from an incompatible version; or a Hub repo id cannot be reached."""


class StorageError(CaptionerError):
    """A file could not be written: the disk is full (ENOSPC), or the file would exceed the
    process's size limit or the user's quota. The file it names was left as it was before."""
