"""Test doubles. Production code never imports this package (only tests do); the stand-in SGLang server is
production code (`forerun.runtime_ext.standin`)."""
