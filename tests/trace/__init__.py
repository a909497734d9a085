"""The trace pipeline (service/trace) without HTTP: rules, plan, compute, steps, the tables and the door."""
