"""Where it runs: the embedded CPU engine, the token-exact SGLang frontend backends, the
ready-distribution cache and gate, the runtime factory and pool, and the SGLang server / gateway launcher
(`launch`)."""
