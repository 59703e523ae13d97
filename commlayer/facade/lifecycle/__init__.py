"""Making and unmaking the world and its groups: init_process_group's arguments, new_group and
subgroups, shrink_group, the process-wide signal handlers, and the facade's extensions."""
