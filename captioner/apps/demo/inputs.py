"""The page's input components: every request value reaches the demo's own checks, and one the page would never
send is refused in one line, not with a traceback in the server's log."""

from __future__ import annotations

from typing import Any

import gradio as gr


class UploadImage(gr.Image):
    """An image input that hands the upload untouched to our loader, which refuses a non-image in one line."""

    is_template = True  # drawn by the frontend's Image component

    def preprocess(self, payload: Any) -> str | None:
        if getattr(payload, "path", None):
            return str(payload.path)
        return super().preprocess(payload)  # a base64 data URL: let Gradio write it to a file (no upload: None)


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
