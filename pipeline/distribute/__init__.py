"""Running a stage's per-item work across a cluster (`--executor ray`) in parts: contiguous
ranges of the sorted listing whose results are written to deterministic names, gathered by the
driver, which then makes every global decision exactly as a local run does."""
