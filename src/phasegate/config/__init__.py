"""The cartridge: its model, its tables, reading and writing phasegate.toml."""
