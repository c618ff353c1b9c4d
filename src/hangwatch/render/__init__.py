"""Renderers: each depends only on the model."""
