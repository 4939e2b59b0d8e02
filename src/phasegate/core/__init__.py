"""Pure parts: the phase contract, profiles, autonomy, decisions; no disk, clock, git or network."""
