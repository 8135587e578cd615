"""One-shot tasks: their model, the operations on them, listing and the due-time window."""
