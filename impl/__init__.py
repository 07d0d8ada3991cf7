"""Production store: the recurrent-state page store held to the spec tables."""
