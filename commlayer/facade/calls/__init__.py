"""One facade call's path: validate, resolve the group, stage, find or build its plan, run it on
the backend, observe it, and turn a failure into a typed error."""
