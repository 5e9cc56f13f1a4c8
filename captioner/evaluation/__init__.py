"""Scores: the official COCO metrics, grounding, interpretability, significance, caption statistics."""
