"""One facade call's path: validate, resolve the group, stage, find or build its plan, launch it on
the backend, observe it, and turn a failure into a typed error."""
