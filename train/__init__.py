"""The training side: streaming shards, models, the DDP loop, checkpoints, monitoring.

May import from `pipeline`; `pipeline` never imports from here (except the CLI entry point).
"""
