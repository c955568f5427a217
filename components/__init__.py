"""KFP components, one per stage: thin wrappers that call the fourm_kfp stage functions."""
