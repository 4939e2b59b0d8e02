"""Everything phasegate does with git: one way to call it, its files, refs, repair,
worktrees, guards and checks."""
