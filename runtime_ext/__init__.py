"""Where it runs: the embedded CPU engine, the token-exact SGLang frontend backends, the
ready-distribution cache and gate, the runtime factory and pool, the SGLang server / gateway launcher
(`launch`), and the stand-in SGLang server (`standin`: the scale-out benchmark's simulated GPU workers)."""
