"""Pictures: attention overlays, head views, saliency figures, training curves (matplotlib)."""
