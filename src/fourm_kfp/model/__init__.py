"""The 4M encoder-decoder: single-device model code, its batch contract, and (separately) parallelisation."""
