"""Deciding what to try next and what to recommend: pure functions of measured trials."""
