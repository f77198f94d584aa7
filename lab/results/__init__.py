"""What a run leaves: the run directory and its tables (rundir), the report and its plots, compare, fidelity, imported tables, expectations and JUnit."""
