"""Words: the PTB-compatible tokenizer and the vocabulary."""
