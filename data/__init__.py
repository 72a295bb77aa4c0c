"""specgym's shipped data (workloads, cost profiles, model pairs, policies); read it through ``specgym.paths``."""
