"""Plain, serializable data: measurements, trials, results, reports, findings, evidence."""
