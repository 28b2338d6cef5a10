"""What is computed: `@sgl.function` programs, the samplers that drive them, and the engine-free
MH / prefetch-tree / DP core (numpy only)."""
