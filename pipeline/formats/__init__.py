"""The files pipe writes and reads: manifest rows, shard members, tar streams, index.json."""
