"""The evaluation prompts: the seven datasets of PreSTO Table 3, their row parsers, offline and hub loading."""
