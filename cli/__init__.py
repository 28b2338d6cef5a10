"""The one `forerun` command: `forerun.cli.main:main` (subcommands registered by the sibling modules)."""
