"""Parts of the loop that are not the loop: the rank's device and precision, the model placed,
sharded or wrapped (`wrapping`), the batch that fits (`micro_batch`), one optimizer step (`step`),
validation, which checkpoint a run resumes (`resume`), checkpoints, the optimizer and its
schedule, what the run prints, and monitoring."""
