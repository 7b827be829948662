"""`pipe report`: one self-contained HTML page about clean, shard and run folders.

Facts are gathered per folder kind (`clean`, `shard`, `run`: plain data, no HTML), then rendered
(`render`, `charts`) by code that escapes every string it was given: file names, labels, texts and
reasons come from the data and are hostile.
"""
