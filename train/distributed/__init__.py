"""Process groups, the launcher, and the preflight that makes every rank agree before any step."""
