"""Measuring models: `contrastive` for image-caption models (pipe train's validation and pipe eval)."""
