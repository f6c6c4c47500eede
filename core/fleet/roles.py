"""The names of the roles a fleet's rows take that are not an instance's own: the router, and a
live trial's candidate (a leaf module: what serves is told from them without loading the fleet's
supervisor, core/deployment.py)."""

ROUTER = "router"  # the router's name among the instances (events, rows)
TRIAL_CANDIDATE = "candidate"  # the role of a live trial's candidate row
