"""The user's loader: its settings as data, reading and rebuilding it, targets, threads."""
