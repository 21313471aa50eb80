"""The command line as a program: bad and hostile input, and what its commands print."""
