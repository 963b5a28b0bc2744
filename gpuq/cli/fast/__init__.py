"""The CLI's fast path (placeholder: the budget follows)."""
