"""Evaluation of a trained 4M model: generation-based cross-modal tasks, metrics, report and the model gate."""
