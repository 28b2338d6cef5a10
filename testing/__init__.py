"""Test doubles. Production code never imports this package (only tests and the fake mode of
`scripts/launch_runtime`)."""
