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
    """A feature store is missing, unfinished, made for another encoder or images, or too big for the disk."""


class RequestError(CaptionerError):
    """A demo request carries a value outside what the page offers (beam, length, model, ...)."""


class ExportError(CaptionerError):
    """An export lacks a file, has one that fails its config or checksum, or is of another version; or a
    Hub repo id cannot be reached."""


class StorageError(CaptionerError):
    """A file could not be written (a full disk, a size limit, a quota); the file it names is left as it was."""
