"""The `specdiff` command line: a thin Click layer over the library."""
