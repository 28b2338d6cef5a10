"""`forerun bench preposition` and the gate calibration: the pre-positioning paper's measurements and tasks."""
