"""The page's input components and its Blocks: every request value reaches the demo's own checks, and one the
page would never send is refused in one line, not with a traceback in the server's log."""

from __future__ import annotations

import os
import reprlib
from pathlib import Path
from typing import Any

import gradio as gr

SHOWN = reprlib.Repr()  # a request value in a refusal: a caller may send megabytes, or nest it deep
SHOWN.maxstring = SHOWN.maxother = 60


class UploadImage(gr.Image):
    """An image input that hands the upload untouched to our loader, which refuses a non-image in one line."""

    is_template = True  # drawn by the frontend's Image component

    def preprocess(self, payload: Any) -> str | None:
        if getattr(payload, "path", None):
            return str(payload.path)
        # A base64 data URL: Gradio decodes it to a file (no upload: None). Only an in-process call brings one:
        # a request's is refused by `check_upload`.
        return super().preprocess(payload)

    def check_upload(self, payload: Any) -> None:
        """Refuse in words a request's value that is not a file uploaded to Gradio's upload folder: an int, a path
        or URL, a dict of other fields, a data URL (Gradio decodes one itself, past our loader's size bound)."""
        from gradio.utils import get_upload_folder

        if payload is None:
            return
        path = payload.get("path") if isinstance(payload, dict) else None
        if isinstance(path, str) and inside(path, Path(get_upload_folder())):
            if valid(self.data_model, payload):
                return
            got = f"dict {SHOWN.repr(payload)}"  # an upload's path, other fields of the wrong type
        else:
            got = described(payload)
        raise gr.Error(f"Request refused: the image must be an uploaded file, got {got}", print_exception=False)


def inside(path: str, folder: Path) -> bool:
    """Whether `path`, its links and `..` followed, is in `folder` (as Gradio's check of an upload has it)."""
    try:
        resolved, folder = Path(os.path.abspath(path)).resolve(), folder.resolve()
    except (OSError, ValueError):  # a loop of links, a NUL byte
        return False
    return resolved != folder and resolved.is_relative_to(folder)


def valid(model: Any, payload: dict) -> bool:
    """Whether the component's data model takes `payload` (a field of the wrong type is Gradio's traceback)."""
    try:
        model.model_validate(payload)
    except ValueError:  # pydantic's ValidationError is one
        return False
    return True


def described(payload: Any) -> str:
    """A request's image value in a few words, for its refusal."""
    where = (payload.get("path") or payload.get("url")) if isinstance(payload, dict) else payload
    if isinstance(where, str):
        if where.startswith("data:"):
            return "a data URL"
        return f"the {'URL' if where.startswith(('http://', 'https://')) else 'path'} {SHOWN.repr(where)}"
    return f"{type(payload).__name__} {SHOWN.repr(payload)}"


class DemoBlocks(gr.Blocks):
    """The page's Blocks: a request whose image is not an upload is refused in one line before Gradio reads it.

    Gradio's own handling of a request's file values (`Blocks.preprocess_data`: `async_move_files_to_cache`, then
    the data model's check) runs before any component method, and refuses such a value with a traceback in the
    server's log and no words for the caller (`show_error=False`); it downloads a URL, and hands a dict without
    Gradio's "meta" field to `preprocess` unchecked, so that our loader would read any path it names. No documented
    hook runs earlier, so this overrides Gradio's internal `preprocess_data` (its signature in Gradio 6);
    tests/test_demo_requests.py sends such values over HTTP, so a Gradio that stops calling it fails there."""

    async def preprocess_data(self, block_fn: Any, inputs: list[Any], state: Any,
                              explicit_call: bool = False) -> list[Any]:
        if not explicit_call:  # a call in this process (`demo(...)`) is no request; Gradio trusts it too
            for block, value in zip(block_fn.inputs, inputs):
                if isinstance(block, UploadImage):
                    block.check_upload(value)
        return await super().preprocess_data(block_fn, inputs, state, explicit_call)


class RequestSlider(gr.Slider):
    """A slider whose request value reaches /caption untouched: `check_request` refuses a bad one in words on the
    page, where Gradio's range check printed a traceback in the server's log (and for "abc" or null, no words)."""

    is_template = True  # drawn by the frontend's Slider component

    def preprocess(self, payload: Any) -> Any:
        return payload


class Menu(gr.Dropdown):
    """A dropdown whose refusal of a value it does not offer is one short line for the page, not a traceback in
    the server's log (its menus also feed the redraw and the figure, so Gradio's check stays)."""

    is_template = True  # drawn by the frontend's Dropdown component

    def preprocess(self, payload: Any) -> Any:
        try:
            return super().preprocess(payload)
        except Exception:  # noqa: BLE001 - Gradio's refusal, of any class, becomes the page's line
            raise gr.Error(f"Request refused: {str(payload)[:40]!r} is not one of the {self.label} menu's choices",
                           print_exception=False) from None
