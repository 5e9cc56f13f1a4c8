"""captioner: image captioning with spatial attention.

    from captioner import load_captioner
    model = load_captioner("runs/shapes_lstm/best.pt")
    caption = model.caption("photo.jpg", beam_size=3)
    caption.text, caption.words, caption.heatmaps()   # (T, h, w) attention per word
"""

from captioner.models.caption import Caption
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import load_captioner

__all__ = ["Caption", "Captioner", "load_captioner"]
__version__ = "0.1.0"
