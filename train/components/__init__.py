"""Parts of the loop that are not the loop: checkpoints, the optimizer and its schedule, what the
run prints, and monitoring."""
