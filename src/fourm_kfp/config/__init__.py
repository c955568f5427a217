"""Typed configuration: dataclasses, presets, linked YAML files and command-line overrides."""
