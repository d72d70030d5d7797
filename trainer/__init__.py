"""Data-parallel training on top of the collectives."""
