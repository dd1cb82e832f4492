"""Diagnosis rules: one module per family, each rule a pure function returning a Finding or None."""
