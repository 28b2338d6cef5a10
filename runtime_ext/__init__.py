"""Where it runs: the embedded CPU engine, the token-exact SGLang frontend backends, the
ready-distribution cache and gate, and the SGLang server launcher."""
