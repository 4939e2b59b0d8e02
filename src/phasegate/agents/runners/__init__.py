"""One module per agent program: its command line, environment, output parsing and quirks."""
