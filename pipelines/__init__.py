"""KFP pipeline definitions; the compiled YAML lives beside them."""
