"""The pipeline stages: each a pure function of (config, inputs) writing one content-addressed output."""
