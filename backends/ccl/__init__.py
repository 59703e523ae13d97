"""oneCCL backend (work in progress)."""
