"""Facts about this machine, and the cache of answers keyed by them."""
