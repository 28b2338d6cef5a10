"""`forerun bench engine`: the embedded engine against transformers and against the hardware's roofline."""
