"""Pictures: attention overlays and head views (numpy and Pillow), saliency figures and training curves (matplotlib)."""
