"""GPU side: torch helpers for recurrent-state pages in the KV block pool (optional extra)."""
