"""Models: the built-ins, the --model factory contract, and fine-tuning (--init-from, --freeze)."""
