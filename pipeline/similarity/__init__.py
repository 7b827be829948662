"""Near-duplicate search without comparing all pairs: perceptual hashes for images, MinHash for texts."""
