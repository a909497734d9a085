"""Trained models served by POST /model: which exist, where their files are, and loading them
(weights widened to float64, the model's own tokenizer). The math is the core's
(:mod:`service.core.encoder`)."""
