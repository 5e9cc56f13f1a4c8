"""The networks and what runs them: encoders, attention, the decoders, the Captioner that joins them
with its vocabulary and preprocessing, decoding (greedy, sampling, beam search) and checkpoints."""
