"""Planning, development and review run by the development graph."""
