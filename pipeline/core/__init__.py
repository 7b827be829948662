"""What every stage shares: errors, atomic files, config, schema loading, the console, the worker pool."""
