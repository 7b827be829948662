"""Parts of the loop that are not the loop: checkpoints and monitoring."""
