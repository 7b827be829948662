"""The streaming reader: a pure per-epoch plan, sequential reads at the index's offsets, decoding in workers."""
