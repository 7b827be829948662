"""pipe: from a messy folder of images and text to clean, sharded, checked training data."""

__version__ = "0.1.0"
