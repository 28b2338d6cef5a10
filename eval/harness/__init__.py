"""`forerun eval`: the methods it compares, their settings, one run file per run, and its report."""
