"""The `pipe` command line (`app`) and one module per command: its options (with help) -> a typed
config -> the stage's `run`."""
