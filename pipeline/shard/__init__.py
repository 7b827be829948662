"""pipe shard: split train/val, measure, pack into webdataset tar shards, index.json last."""
