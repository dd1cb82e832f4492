"""Running a loader and measuring it: windows, process probes, failures, experiments."""
