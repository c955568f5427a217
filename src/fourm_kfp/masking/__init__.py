"""4M's multimodal masking: Dirichlet budget splits, span masking of text, per-sample slots and collation."""
