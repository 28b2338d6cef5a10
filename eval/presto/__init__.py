"""`forerun bench presto` and `forerun bench reference`: PreSTO's speed measurements (Table 7), side by side."""
