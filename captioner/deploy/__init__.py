"""Captioning without PyTorch: an exported model's ONNX encoder and decoder step, run by
onnxruntime with numpy and Pillow alone (beam search, greedy decoding, attention maps). Nothing
here imports torch; an import-linter contract in pyproject.toml holds it to that."""
